"""Campaigns: the saga as one object — suspects, single-delta runs, a pre-registered grid of actions,
owner calls in Slack, and the saga chart (docs/campaigns.md)."""
