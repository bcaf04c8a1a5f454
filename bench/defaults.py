"""One defaults table, shared by the Python API and the CLI (torch-fidelity style)."""

# Official VAR FID protocol (VAR README, "Sampling & Zero-shot Inference").
SAMPLING = {"cfg": 1.5, "top_k": 900, "top_p": 0.96, "more_smooth": False}

WORLDS = ("tiny", "paper")
DEFAULT_WORLD = "tiny"
