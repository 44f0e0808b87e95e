"""Training: the recipe's phases, the training step, stages, preference methods, rewards.

`recipe` runs a training stage's phases (setup, load checkpoint, train, save, cleanup), `trainer`
is TRL's trainers with checkpoint finalization and resume-exact logging (the training step),
`arguments` what the run config becomes for them (SFTConfig, callbacks, the environment they read),
`stages` runs a profile's stages in order (SFT -> DPO -> GRPO), each from the previous adapter,
`preference` is DPO and GRPO on the same machinery, `rewards` the GRPO reward functions, `torchrun`
the launcher the rendered run script starts training with (torchrun, with a stop's code and line). The top of
the payload: it may import outputs/, data/, model/, volume/, config/ and the base.
"""
