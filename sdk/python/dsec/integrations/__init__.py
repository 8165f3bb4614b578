"""Adapters that let other frameworks run their sandboxes on dsec (each an
optional extra of the SDK; docs/integrations.md)."""
