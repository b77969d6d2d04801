"""What a trainer's output says: printed lines, presets, records, and when a source is unreadable. Pure."""
