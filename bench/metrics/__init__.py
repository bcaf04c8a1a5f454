"""Metrics in two worlds. Importing this package imports nothing heavy; its modules:

- :mod:`bench.metrics.catalog`: every metric's name, header, direction and format (torch-free; what
  the renderer reads);
- :mod:`bench.metrics.features`: the tiny world's feature CNN (``tinyshapes-cnn``), its training and
  its torch-fidelity feature extractor;
- :mod:`bench.metrics.fidelity`: feature extraction once, metrics via torch-fidelity's functions,
  bootstrap error bars, :func:`~bench.metrics.fidelity.evaluate`;
- :mod:`bench.metrics.paper`: InceptionV3 (``inception-v3-compat``) from local weights and the ADM
  ImageNet-256 reference batch.

No weights file is needed to import them; weights are read when features are first extracted.
"""
