"""The multi-turn maze environment: actions in, image + feedback out, episode statistics."""
