"""The policy: model/processor loading, the tiny-model builder, prompts and observations."""
