"""Where messages go: the channels (console, Slack) and the outbox's delivery worker."""
