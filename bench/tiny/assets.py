"""Where the tiny world's shipped checkpoints live (``assets/tiny/``, or ``$VARBENCH_TINY_DIR``)."""
from bench.resources import tiny_assets_dir

ASSETS = tiny_assets_dir()
