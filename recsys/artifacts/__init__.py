"""What the pipelines write and serving and evaluation read: the model directory (`model_dir`), the bundle
(`bundle`), the per-user ranks of an evaluation (`per_user`), the evaluation directory (`evaluation_dir`, with
`comparison` of two of them), the items added at run time (`added_items`), and the model registry's read side
(`registry`). docs/serving.md describes the bundle; README's architecture section the rest."""
