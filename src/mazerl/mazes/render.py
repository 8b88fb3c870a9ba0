"""Draw a maze state as an RGB image (VisGym's picture by default) or as ASCII text.

The picture is assembled from per-square tiles, so a frame costs one gather, and moving the agent
only repaints the two squares it left and entered (`FrameRenderer.move_agent`).
VisGym's look: 25 px squares, white floor, (169,169,169) walls, a full red goal square, a blue
disc of radius 25/4 for the agent, no grid lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from .layout import WALL, Position

RGB = tuple[int, int, int]


@dataclass(frozen=True)
class Palette:
    floor: RGB
    wall: RGB
    goal: RGB
    agent: RGB


PALETTES: dict[str, Palette] = {
    "visgym": Palette(floor=(255, 255, 255), wall=(169, 169, 169), goal=(255, 0, 0), agent=(0, 0, 255)),
    # Every channel inverted: tests whether the policy learned shapes rather than absolute colours.
    "inverted": Palette(floor=(0, 0, 0), wall=(86, 86, 86), goal=(0, 255, 255), agent=(255, 255, 0)),
    # Goal and agent colours exchanged: a policy keyed on "red = goal" is misled.
    "swapped": Palette(floor=(255, 255, 255), wall=(169, 169, 169), goal=(0, 0, 255), agent=(255, 0, 0)),
    "dark": Palette(floor=(32, 32, 40), wall=(200, 200, 200), goal=(0, 200, 0), agent=(255, 160, 0)),
}


class RenderOptions(BaseModel):
    """How a maze is drawn. Defaults reproduce VisGym's `maze_2d` frames exactly."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid", frozen=True)

    square_px: int = Field(25, ge=4, le=128, description="pixels per grid square")
    palette: Literal["visgym", "inverted", "swapped", "dark"] = "visgym"
    agent_marker: Literal["disc", "square", "diamond"] = "disc"
    goal_marker: Literal["square", "disc", "ring"] = "square"
    wall_style: Literal["block", "thin"] = "block"


VISGYM_RENDER = RenderOptions()


def _marker_mask(kind: str, s: int) -> np.ndarray:
    """Boolean (s, s) mask of a marker inside one square."""
    # VisGym's disc: radius s/4 around the square's centre (integer pixel grid, centre at s//2).
    centre = s // 2
    r = s // 4
    yy, xx = np.mgrid[0:s, 0:s] + 0.5
    dy, dx = yy - centre, xx - centre
    if kind == "square":
        return np.ones((s, s), dtype=bool)
    if kind == "disc":
        return dy * dy + dx * dx <= r * r
    if kind == "diamond":
        return np.abs(dy) + np.abs(dx) <= 1.3 * r
    if kind == "ring":
        d2 = dy * dy + dx * dx
        outer = s * 0.42
        return (d2 <= outer * outer) & (d2 >= (outer * 0.6) ** 2)
    raise ValueError(f"unknown marker {kind!r}")


def _thin_wall_tiles(s: int, floor: RGB, wall: RGB) -> np.ndarray:
    """16 tiles, one per set of wall neighbours (bit 0 right, 1 up, 2 left, 3 down)."""
    t = max(2, s // 6)
    lo = (s - t) // 2
    hi = lo + t
    tiles = np.empty((16, s, s, 3), dtype=np.uint8)
    tiles[:] = floor
    for code in range(16):
        tile = tiles[code]
        tile[lo:hi, lo:hi] = wall
        if code & 1:
            tile[lo:hi, lo:] = wall
        if code & 2:
            tile[:hi, lo:hi] = wall
        if code & 4:
            tile[lo:hi, :hi] = wall
        if code & 8:
            tile[lo:, lo:hi] = wall
    return tiles


class FrameRenderer:
    """Renders one maze's frames. Build once per maze; frames for any agent position are cheap."""

    def __init__(self, grid: np.ndarray, goal: Position, options: RenderOptions = VISGYM_RENDER):
        self.options = options
        self.grid = grid
        self.goal = goal
        s = options.square_px
        self.square_px = s
        pal = PALETTES[options.palette]
        h, w = grid.shape
        if options.wall_style == "block":
            tiles = np.empty((2, s, s, 3), dtype=np.uint8)
            tiles[0] = pal.floor
            tiles[1] = pal.wall
            codes = grid.astype(np.intp)
            floor_code = 0
        else:
            tiles = np.concatenate([_thin_wall_tiles(s, pal.floor, pal.wall), np.empty((1, s, s, 3), np.uint8)])
            tiles[16] = pal.floor
            walls = grid == WALL
            padded = np.pad(walls, 1, constant_values=False)
            codes = (
                padded[1:-1, 2:] * 1 + padded[:-2, 1:-1] * 2 + padded[1:-1, :-2] * 4 + padded[2:, 1:-1] * 8
            ).astype(np.intp)
            floor_code = 16
            codes = np.where(walls, codes, floor_code)
        image = tiles[codes].transpose(0, 2, 1, 3, 4).reshape(h * s, w * s, 3)
        gr, gc = goal
        goal_square = image[gr * s : (gr + 1) * s, gc * s : (gc + 1) * s]
        goal_square[_marker_mask(options.goal_marker, s)] = pal.goal
        goal_square = goal_square.copy()
        self.background = np.ascontiguousarray(image)
        # The agent only ever stands on floor or on the goal, so two pre-painted sprites cover every
        # case and moving it is two plain slice copies.
        agent_mask = _marker_mask(options.agent_marker, s)
        self._sprite_floor = tiles[floor_code].copy()
        self._sprite_floor[agent_mask] = pal.agent
        self._sprite_goal = goal_square.copy()
        self._sprite_goal[agent_mask] = pal.agent

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.background.shape  # type: ignore[return-value]

    def frame(self, agent: Position) -> np.ndarray:
        """A new (H*s, W*s, 3) uint8 image with the agent at `agent`."""
        image = self.background.copy()
        self._paint_agent(image, agent)
        return image

    def move_agent(self, image: np.ndarray, old: Position, new: Position) -> None:
        """Update `image` in place from the agent at `old` to the agent at `new`."""
        if old == new:
            return
        s = self.square_px
        r, c = old
        image[r * s : (r + 1) * s, c * s : (c + 1) * s] = self.background[r * s : (r + 1) * s, c * s : (c + 1) * s]
        self._paint_agent(image, new)

    def _paint_agent(self, image: np.ndarray, agent: Position) -> None:
        s = self.square_px
        r, c = agent
        image[r * s : (r + 1) * s, c * s : (c + 1) * s] = self._sprite_goal if agent == self.goal else self._sprite_floor


def render_rgb(grid: np.ndarray, agent: Position, goal: Position, options: RenderOptions = VISGYM_RENDER) -> np.ndarray:
    return FrameRenderer(grid, goal, options).frame(agent)


def render_ascii(grid: np.ndarray, agent: Position, goal: Position) -> str:
    """`#` wall, `.` floor, `G` goal, `A` agent (`*` when the agent stands on the goal)."""
    rows = [["#" if v == WALL else "." for v in row] for row in grid.tolist()]
    rows[goal[0]][goal[1]] = "G"
    rows[agent[0]][agent[1]] = "*" if agent == goal else "A"
    return "\n".join("".join(r) for r in rows)
