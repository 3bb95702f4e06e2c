"""Offline preference presets for `rlvr dpo --preset NAME`: one YAML per published loss."""
