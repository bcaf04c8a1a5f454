"""Where the tiny world's shipped checkpoints live (``assets/tiny/``, or ``$VARBENCH_TINY_DIR``)."""
import os
from pathlib import Path

ASSETS = Path(os.environ.get("VARBENCH_TINY_DIR") or Path(__file__).resolve().parents[2] / "assets" / "tiny")
