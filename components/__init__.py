"""KFP v2 lightweight components: one module per pipeline stage, each a thin typed adapter that
calls one `mazerl.workflow` function. `build(base_image)` turns them into components for a profile."""

from kfp import dsl

from . import compare, evaluate, generate_mazes, promote, train_grpo, warm_start


def build(base_image: str, evaluate_image: str | None = None) -> dict:
    """name -> KFP component, with the profile's image (never the kfp package installed at run time);
    `evaluate_image`: the evaluate component's own image (the trainer image, which has vLLM), if other."""
    make = dsl.component(base_image=base_image, install_kfp_package=False)
    make_evaluate = dsl.component(base_image=evaluate_image, install_kfp_package=False) if evaluate_image else make
    return {
        "draw_train_seed": make(generate_mazes.draw_train_seed),
        "generate_mazes": make(generate_mazes.generate_mazes),
        "resolve_model": make(warm_start.resolve_model),
        "warm_start": make(warm_start.warm_start),
        "train_grpo": make(train_grpo.train_grpo),
        "evaluate": make_evaluate(evaluate.evaluate),
        "compare": make(compare.compare),
        "promote": make(promote.promote),
        "cleanup": make(promote.cleanup),
    }
