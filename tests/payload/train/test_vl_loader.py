"""Vision-language batches are collated in dataloader workers on a GPU (payload.train.arguments.dataloader_workers):
the batches, and the main process's RNG stream (dropout), are the same as without workers."""

import torch

from payload.train import arguments
from payload.train import recipe as train
from payload.train.run import Run
from train_fixtures import VL_MODEL, make_config, train_env, write_vl_data  # noqa: F401  (fixture)


def test_vl_batches_and_rng_are_the_same_with_dataloader_workers(train_env):
    cfg = make_config(train_env, "workers", model=VL_MODEL, train={"max_steps": 2})
    write_vl_data(cfg.run_dir, n_train=12, n_val=0)
    (cfg.run_dir / "data" / "val.jsonl").unlink()
    run = Run(cfg=cfg, run_dir=cfg.run_dir)
    try:
        train.setup(run)
        assert run.trainer.args.dataloader_num_workers == 0  # on CPU: nothing to overlap with

        def batches(workers: int):
            run.trainer.args.dataloader_num_workers = workers
            torch.manual_seed(0)
            got = [b for b, _ in zip(run.trainer.get_train_dataloader(), range(4))]
            return got, torch.get_rng_state()

        (plain, rng_plain), (workers, rng_workers) = batches(0), batches(2)
    finally:
        train.cleanup(run)
    assert len(plain) == len(workers) == 4
    assert any("pixel_values" in b for b in plain)  # images among them (every 4th record is text only)
    for a, b in zip(plain, workers):
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), k
    assert torch.equal(rng_plain, rng_workers)


def test_workers_only_for_vision_language_on_a_gpu(train_env, monkeypatch):
    vl = make_config(train_env, "vl", model=VL_MODEL)
    text = make_config(train_env, "text")
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert arguments.dataloader_workers(vl, gpu=True) == arguments.VL_LOADER_WORKERS
    assert arguments.dataloader_workers(vl, gpu=False) == 0 and arguments.dataloader_workers(text, gpu=True) == 0
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # 16 cores shared by 8 ranks: one worker each
    assert arguments.dataloader_workers(vl, gpu=True) == 1
