"""KFP v2 lightweight components: one module per pipeline stage, each a thin typed adapter that
calls one `mazerl.workflow` function. `build(base_image)` turns them into components for a profile."""

from kfp import dsl

from . import compare, evaluate, generate_mazes, promote, train_grpo, warm_start


def build(base_image: str) -> dict:
    """name -> KFP component, with the profile's image (never the kfp package installed at run time)."""
    make = dsl.component(base_image=base_image, install_kfp_package=False)
    return {
        "draw_train_seed": make(generate_mazes.draw_train_seed),
        "generate_mazes": make(generate_mazes.generate_mazes),
        "resolve_model": make(warm_start.resolve_model),
        "warm_start": make(warm_start.warm_start),
        "train_grpo": make(train_grpo.train_grpo),
        "evaluate": make(evaluate.evaluate),
        "compare": make(compare.compare),
        "promote": make(promote.promote),
        "cleanup": make(promote.cleanup),
    }
