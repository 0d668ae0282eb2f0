"""Leaf features (issue 38): LightGBM trees fitted on the train split whose leaf ids become sparse ids."""
