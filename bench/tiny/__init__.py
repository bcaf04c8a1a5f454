"""The tiny world's shipped models: configs (``configs``) and the recipes that train them (``train``)."""
