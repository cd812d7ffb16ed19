"""A deliberately simple model of one lane of ``split`` / ``pack`` / ``to_training``.

It computes, from the documented contract alone (docs/operators.md, docs/training_batches.md
and the docstrings of ``Dataset.batch``, ``pack`` and ``to_training``), the global batches of

    Dataset.source(docs).repeat(1) [.split(max_len)]
        .pack(seq_len, method, num_bins, max_segments) [.to_training(...)]
        .batch(B, num_lanes=1)

with one lane and no shuffle, so that the lane reads the documents in order. Nothing here
imports the package: it is plain Python lists, turned into numpy arrays only at the end.

The rules it follows, one piece at a time:

* ``split(max_len)``: a document longer than ``max_len`` becomes ``ceil(n / max_len)``
  pieces of ``max_len`` tokens (the last one shorter); others pass whole.
* ``pack``: empty pieces are dropped. ``best_fit`` keeps ``num_bins`` numbered rows and puts
  a piece into the fullest row with room (the lowest-numbered of equals); ``first_fit``
  keeps its rows in the order they opened and puts a piece into the first with room. When
  no row has room (every row holds something), the fullest row (the lowest-numbered of
  equals; for ``first_fit`` the first opened) is emitted and the piece starts a new row: for
  ``best_fit`` in the emitted row's number, for ``first_fit`` after the others. A row that is
  full, or holds ``max_segments`` pieces, is emitted at once (``first_fit``'s next row then
  opens after the others too). At the end of the input the rows still open are emitted in their order
  (``best_fit``: by number; ``first_fit``: the order they opened).
* a row becomes ``tokens`` (zero padded), ``tokens_segment_ids`` (1, 2, ... per piece, 0 on
  padding) and ``tokens_positions`` (0-based within each piece, 0 on padding), all int32.
* ``to_training``: the default convention and MaxText's, with either field names.
* ``batch(B)``: consecutive rows ``B`` at a time; the final partial batch is dropped.
"""

from __future__ import annotations

import numpy as np


def split(documents: list[list[int]], max_len: int | None) -> list[list[int]]:
    """Each document cut into pieces of at most ``max_len`` tokens (``None``: no cut)."""
    if max_len is None:
        return [list(d) for d in documents]
    pieces = []
    for doc in documents:
        if len(doc) <= max_len:
            pieces.append(list(doc))
        else:
            pieces.extend(list(doc[i : i + max_len]) for i in range(0, len(doc), max_len))
    return pieces


def _fill(row: list[list[int]]) -> int:
    return sum(len(piece) for piece in row)


def _fullest(rows: list[list[list[int]]]) -> int:
    """The index of the fullest row, the lowest of equals."""
    best = 0
    for i, row in enumerate(rows):
        if _fill(row) > _fill(rows[best]):
            best = i
    return best


def pack_best_fit(pieces, seq_len: int, num_bins: int, max_segments: int | None) -> list:
    """Rows (lists of pieces) in the order ``best_fit`` emits them."""
    rows: list[list[list[int]]] = [[] for _ in range(num_bins)]  # row i is numbered i
    emitted = []
    for piece in pieces:
        if not piece:
            continue
        with_room = [i for i in range(num_bins) if _fill(rows[i]) + len(piece) <= seq_len]
        if with_room:
            target = with_room[0]
            for i in with_room:  # the fullest, the lowest-numbered of equals
                if _fill(rows[i]) > _fill(rows[target]):
                    target = i
        else:  # every row holds something and none has room
            target = _fullest(rows)
            emitted.append(rows[target])
            rows[target] = []
        rows[target].append(piece)
        if _fill(rows[target]) == seq_len or len(rows[target]) == max_segments:
            emitted.append(rows[target])
            rows[target] = []
    return emitted + [row for row in rows if row]


def pack_first_fit(pieces, seq_len: int, num_bins: int, max_segments: int | None) -> list:
    """Rows (lists of pieces) in the order ``first_fit`` emits them."""
    rows: list[list[list[int]]] = []  # the open rows that hold something, in opening order
    emitted = []
    for piece in pieces:
        if not piece:
            continue
        with_room = [i for i, row in enumerate(rows) if _fill(row) + len(piece) <= seq_len]
        if with_room:
            target = with_room[0]
        else:
            if len(rows) == num_bins:  # no row left to open: emit the fullest
                emitted.append(rows.pop(_fullest(rows)))
            rows.append([])  # the new row goes after the others
            target = len(rows) - 1
        rows[target].append(piece)
        if _fill(rows[target]) == seq_len or len(rows[target]) == max_segments:
            emitted.append(rows.pop(target))
    return emitted + rows


def row_arrays(row: list[list[int]], seq_len: int) -> dict[str, np.ndarray]:
    """A packed row: tokens, segment ids and positions, padded with 0 to ``seq_len``."""
    tokens, segment_ids, positions = [], [], []
    for segment, piece in enumerate(row, start=1):
        tokens += piece
        segment_ids += [segment] * len(piece)
        positions += list(range(len(piece)))
    pad = [0] * (seq_len - len(tokens))
    return {
        "tokens": np.array(tokens + pad, np.int32),
        "tokens_segment_ids": np.array(segment_ids + pad, np.int32),
        "tokens_positions": np.array(positions + pad, np.int32),
    }


def training_default(row: dict, pad_id: int) -> tuple[list[int], list[int]]:
    """Targets and loss mask (0/1) of the default convention, position by position."""
    tokens, seg = row["tokens"].tolist(), row["tokens_segment_ids"].tolist()
    targets, mask = [], []
    for t in range(len(tokens)):
        same = t + 1 < len(tokens) and seg[t] != 0 and seg[t + 1] == seg[t]
        targets.append(tokens[t + 1] if same else pad_id)
        mask.append(1 if same else 0)
    return targets, mask


def training_maxtext(row: dict, pad_id: int) -> tuple[list[int], list[int]]:
    """Targets and ``targets_segmentation`` of MaxText's convention (rows without a
    ``loss_mask``: every token is trained on; padding is 0)."""
    tokens, seg = row["tokens"].tolist(), row["tokens_segment_ids"].tolist()
    y = [tok if s != 0 else 0 for tok, s in zip(tokens, seg)]
    targets, weights = [], []
    for t in range(len(tokens)):
        last = t + 1 == len(tokens)
        target = pad_id if last else y[t + 1]
        weight = 0 if last else seg[t + 1]
        targets.append(target)
        weights.append(0 if target == pad_id else weight)
    return targets, weights


def to_training(row: dict, pad_id: int, field_names: str, convention: str) -> dict:
    """The training fields of a packed row (see docs/training_batches.md)."""
    seg, pos = row["tokens_segment_ids"], row["tokens_positions"]
    if convention == "default":
        targets, mask = training_default(row, pad_id)
        weights = [s if m else 0 for s, m in zip(seg.tolist(), mask)]
    else:
        targets, weights = training_maxtext(row, pad_id)
        mask = [1 if w != 0 else 0 for w in weights]
    if field_names == "maxtext":
        return {
            "inputs": row["tokens"].copy(),
            "inputs_segmentation": seg.copy(),
            "inputs_position": pos.copy(),
            "targets": np.array(targets, np.int32),
            "targets_segmentation": np.array(weights, np.int32),
            "targets_position": pos.copy(),
        }
    return {
        "inputs": row["tokens"].copy(),
        "targets": np.array(targets, np.int32),
        "loss_mask": np.array(mask, np.float32),
        "segment_ids": seg.copy(),
        "positions": pos.copy(),
    }


def batches(
    documents: list[list[int]],
    *,
    seq_len: int,
    method: str,
    num_bins: int,
    batch_size: int,
    max_len: int | None = None,
    max_segments: int | None = None,
    training: dict | None = None,
) -> list[dict[str, np.ndarray]]:
    """The global batches of the pipeline the module docstring shows, to the input's end.

    ``training``: ``None`` (no ``to_training``) or its keyword arguments (``pad_id``,
    ``field_names``, ``convention``, each with the default of ``to_training``)."""
    pack = {"best_fit": pack_best_fit, "first_fit": pack_first_fit}[method]
    rows = [row_arrays(r, seq_len) for r in pack(split(documents, max_len), seq_len, num_bins,
                                                 max_segments)]  # fmt: skip
    if training is not None:
        options = {"pad_id": 0, "field_names": "default", "convention": "default", **training}
        rows = [to_training(row, **options) for row in rows]
    out = []
    for start in range(0, len(rows) - batch_size + 1, batch_size):
        chunk = rows[start : start + batch_size]
        out.append({name: np.stack([row[name] for row in chunk]) for name in chunk[0]})
    return out
