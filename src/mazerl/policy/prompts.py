"""What the model reads: the task prompt (our own words) and the text of each turn."""

from __future__ import annotations

SYSTEM_PROMPT = (
    "You are moving a blue dot through a maze drawn from above. Grey squares are walls, white "
    "squares are open floor, and the red square is the goal. Each turn you see the maze and choose "
    "one move: right, up, left or down moves the dot by one square; walls block it. Say stop when "
    "the dot is on the goal. End your reply with <action>ACTION</action>, where ACTION is one of "
    "right, up, left, down, stop."
)

# For the tiny CPU model: the same instructions in few tokens (sequence length is its main cost).
SHORT_SYSTEM_PROMPT = "Maze: move the blue dot to the red square, grey is wall. Answer <action>right|up|left|down|stop</action>."
PROMPTS = {"full": SYSTEM_PROMPT, "short": SHORT_SYSTEM_PROMPT}


def turn_text(feedback: str, turn: int, max_turns: int) -> str:
    """The text that goes with each new image: the last move's feedback and the turn count."""
    head = f"{feedback} " if feedback else ""
    return f"{head}Turn {turn} of {max_turns}. Your move?"
