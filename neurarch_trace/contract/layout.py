"""Positions of the components of a written graph (the format's ``position {x, y}``)."""

from __future__ import annotations

from typing import Dict, Iterable, List, Tuple

from neurarch_trace.contract.order import levels

__all__ = ["layout"]

#: Pixels between rows (one per longest-path level) and between siblings in a row.
ROW_PX = 100
COLUMN_PX = 240


def layout(component_ids: List[str], edges: Iterable[Tuple[str, str]]) -> Dict[str, Dict[str, int]]:
    """Place components in rows by longest path from the sources: ``{id: {"x": px, "y": px}}``.

    Rows are 100 px apart, siblings in a row 240 px apart. Linear in nodes plus edges; the input
    order is kept within a row, so the layout is deterministic.
    """
    level = levels(component_ids, edges)
    column: Dict[int, int] = {}
    pos: Dict[str, Dict[str, int]] = {}
    for cid in component_ids:
        row = level[cid]
        col = column.get(row, 0)
        column[row] = col + 1
        pos[cid] = {"x": col * COLUMN_PX, "y": row * ROW_PX}
    return pos
