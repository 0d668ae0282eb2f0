"""The promotion gate: a challenger student replaces the champion only if every check passes."""
