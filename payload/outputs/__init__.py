"""What a run hands back besides its checkpoints: evaluation, samples, reports, merged and exported models.

`evaluate` scores a split (loss, task metrics), `infer` generates (chat, samples), `tracking` reports
to W&B, `merge` writes the merged model, `export` the MLX export, `manifest` the MANIFEST every fetch
is verified against. It may import data/, model/, volume/, config/ and the base; train/ calls it.
"""
