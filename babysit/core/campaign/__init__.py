"""A campaign: its spec, the single-delta rule, the grid and its words. Pure."""
