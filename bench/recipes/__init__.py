"""Training recipes (top layer, next to the CLI): they may use every layer below, nothing imports them."""
