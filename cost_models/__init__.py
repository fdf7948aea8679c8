"""Data package ``autopar.cost_models``: device profiles (devices/<id>.yaml) and other cost-model data."""
