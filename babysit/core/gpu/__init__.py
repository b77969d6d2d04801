"""GPU decisions: Xid catalog, health signals, which GPUs to choose, the GPU report. Pure."""
