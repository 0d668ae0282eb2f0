"""The Feast feature repo, generated from the platform config: entities (sparse features with
`entity: true`), one feature view per aggregate, one FeatureService per model version."""
