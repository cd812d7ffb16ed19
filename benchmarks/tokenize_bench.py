"""Tokenization throughput: blocks of records encoded in one call vs one by one.

    python benchmarks/tokenize_bench.py [--quick] [--seconds 6] [--json out.json]

For each tokenizer library (trained here on a synthetic corpus, no downloads):

* ``encode``: the tokenizer alone, ``encode_batch`` over blocks of 256 texts vs
  ``encode`` in a loop (the most batching can give);
* ``pipeline``: ``source -> shuffle -> tokenize -> pack(concat) -> batch`` with
  zephon_jax's ``tokenize`` (batched per block of records, the default) and the
  same tokenizer applied one record at a time (``map`` of ``TokenizeTransform.apply``);
* ``grain``: Grain's ``MapDataset.map`` of the same per-record function, then
  ``ConcatThenSplitIterDataset`` and ``batch``, run side by side in this process.

Rates are medians over timed windows (records/s counts the EOS token every
record ends with; tokens/s counts non-padding tokens). ``bench.py``'s
``tokenize`` case runs the same pipelines interleaved, on texts of log-normal
lengths, with the pieces defined here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np
from grain.experimental import FlatMapTransform

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from measure import close as _close  # noqa: E402
from measure import timed_windows as _timed_windows  # noqa: E402
from measure import timing as _timing  # noqa: E402

import zephon_jax as zj  # noqa: E402
from zephon_jax.tools.tokenizers import WORD_PATTERN, learn_byte_pair_ranks  # noqa: E402
from zephon_jax.transforms.tokenize import TokenizeTransform  # noqa: E402

WORDS = (
    "the of and to in is was for on that with as by at from his her it an were are which "
    "this be or have had not but they one all their there been has when who will more no "
    "if out so said what up its about into than them can only other new some could time "
    "these two may then do first any my now such like our over man me even most made after "
    "also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see "
    "men work long get here between both life being under never day same another know while "
    "last might us great old year off come since against go came right used take three"
).split()
EOS_TEXT = "<eos>"
PATTERN = WORD_PATTERN


KINDS = ("tokenizers", "transformers", "tiktoken", "sentencepiece")


def make_texts(num: int, min_words: int = 20, max_words: int = 400, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_words, max_words + 1, size=num)
    return [" ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=n)) for n in lengths]


def make_lognormal_texts(
    num: int,
    mean_words: float = 300.0,
    sigma: float = 1.0,
    max_words: int = 8000,
    rare: float = 0.1,
    seed: int = 0,
) -> list[str]:
    """``num`` texts of log-normal word counts (mean about ``mean_words``), web-text-like.

    Words are the common ``WORDS`` with Zipf frequencies, except a share ``rare``
    drawn from 20,000 random letter strings, which a trained vocabulary splits
    into several tokens (and a tokenizer's word cache rarely holds).
    """
    rng = np.random.default_rng(seed)
    mu = np.log(mean_words) - sigma**2 / 2
    lengths = np.clip(np.rint(rng.lognormal(mu, sigma, size=num)), 1, max_words).astype(np.int64)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    rare_words = ["".join(rng.choice(letters, size=n)) for n in rng.integers(3, 10, size=20_000)]
    vocab = np.array(list(WORDS) + rare_words, dtype=object)
    zipf = 1.0 / np.arange(1, len(WORDS) + 1)
    total = int(lengths.sum())
    common = rng.choice(len(WORDS), size=total, p=zipf / zipf.sum())
    uncommon = len(WORDS) + rng.integers(0, len(rare_words), size=total)
    words = vocab[np.where(rng.random(total) < rare, uncommon, common)]
    ends = np.cumsum(lengths)
    return [" ".join(words[e - n : e]) for n, e in zip(lengths, ends)]


def train_tokenizers(
    texts: list[str],
    kinds: tuple[str, ...] = KINDS,
    vocab_size: int = 1000,
    tiktoken_texts: int = 2000,
    tiktoken_merges: int = 600,
) -> dict[str, Any]:
    """One tokenizer per library in ``kinds``, trained on ``texts`` (id 1 is never a text token).

    ``tokenizers``/``transformers``: a byte-level BPE of ``vocab_size`` (ids 0, 1:
    ``<pad>``, ``<eos>``); ``tiktoken``: ``tiktoken_merges`` merges learned on the
    first ``tiktoken_texts`` texts (id 1 is the byte 0x01); ``sentencepiece``: a
    BPE model of 500 pieces (id 1 is ``<s>``).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(
        texts[:20000],
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<pad>", EOS_TEXT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    out: dict[str, Any] = {"tokenizers": bpe}
    if "transformers" in kinds:
        from transformers import PreTrainedTokenizerFast

        out["transformers"] = PreTrainedTokenizerFast(tokenizer_object=bpe)
    if "tiktoken" in kinds:
        import tiktoken

        out["tiktoken"] = tiktoken.Encoding(
            name="bench",
            pat_str=PATTERN,
            mergeable_ranks=learn_byte_pair_ranks(texts[:tiktoken_texts], tiktoken_merges),
            special_tokens={},
        )
    if "sentencepiece" in kinds:
        out["sentencepiece"] = _sentencepiece(texts)
    return {k: out[k] for k in kinds}


def describe_tokenizer(tokenizer: Any) -> str:
    """The library and vocabulary size of a tokenizer of :func:`train_tokenizers`."""
    if hasattr(tokenizer, "get_vocab_size"):
        size = tokenizer.get_vocab_size()
    elif hasattr(tokenizer, "n_vocab"):
        size = tokenizer.n_vocab
    else:
        size = len(tokenizer)
    return f"{type(tokenizer).__module__}.{type(tokenizer).__name__}, {size} ids"


def _sentencepiece(texts: list[str]) -> Any:
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "corpus.txt")
        with open(path, "w") as f:
            f.write("\n".join(texts[:5000]))
        spm.SentencePieceTrainer.train(
            input=path,
            model_prefix=os.path.join(tmp, "sp"),
            vocab_size=500,
            model_type="bpe",
            minloglevel=2,
        )
        return spm.SentencePieceProcessor(model_file=os.path.join(tmp, "sp.model"))


class OneByOne:
    """``TokenizeTransform.apply`` as a plain function: one encode call per record."""

    def __init__(self, transform: TokenizeTransform):
        self.transform = transform

    def __call__(self, record: dict) -> dict:
        return self.transform.apply(record, ())


def _median_rate(fn, windows: int, window_s: float) -> float:
    rates = []
    for _ in range(windows):
        units, start = 0, time.perf_counter()
        while time.perf_counter() - start < window_s:
            units += fn()
        rates.append(units / (time.perf_counter() - start))
    return statistics.median(rates)


def encode_only(transform: TokenizeTransform, texts: list[str], timing) -> dict:
    """The tokenizer alone: records/s with ``encode_batch`` on blocks of 256 vs ``encode``."""
    warmup_s, window_s, windows = timing
    tok = transform.tokenizer
    cursor = [0]

    def block():
        start = cursor[0] % (len(texts) - 256)
        cursor[0] += 256
        return texts[start : start + 256]

    def batched():
        tok.encode_batch(block())
        return 256

    def single():
        for t in block():
            tok.encode(t)
        return 256

    _median_rate(batched, 1, warmup_s)
    b = _median_rate(batched, windows, window_s)
    _median_rate(single, 1, warmup_s)
    s = _median_rate(single, windows, window_s)
    return {"batched_records_per_s": b, "one_by_one_records_per_s": s, "ratio": b / s}


EOS = 1  # appended to every record; no tokenizer of train_tokenizers encodes text to it


class PackedTally:
    """Counts a packed batch: returns (real tokens, token slots), adds its records up.

    Every record ends with one ``eos`` token, so ``records`` is the number of
    records in the batches counted so far (a record split across rows counts once).
    """

    def __init__(self, eos: int = EOS):
        self.eos = eos
        self.records = 0.0

    def __call__(self, batch: dict) -> tuple[float, float]:
        tokens, seg = batch["tokens"], batch["tokens_segment_ids"]
        self.records += float(np.count_nonzero((tokens == self.eos) & (seg > 0)))
        return float(np.count_nonzero(seg)), float(seg.size)


def zephon_pipeline(
    records: list[dict],
    tokenizer: Any,
    seq_len: int,
    batch_size: int,
    batched: bool,
    num_lanes: int | None = None,
) -> zj.BatchedDataset:
    """``source -> shuffle -> tokenize -> pack(concat) -> batch(batch_size, num_lanes)``.

    ``batched``: ``Dataset.tokenize`` (blocks of records encoded in one call where
    the tokenizer batches); else a ``map`` encoding one record per call.
    """
    base = zj.Dataset.source(records).shuffle(seed=0)
    if batched:
        ds = base.tokenize(tokenizer, eos_id=EOS)
    else:
        ds = base.map(OneByOne(TokenizeTransform(tokenizer, eos_id=EOS)))
    return ds.pack(seq_len, method="concat").batch(batch_size, num_lanes)


def grain_pipeline(
    records: list[dict],
    tokenizer: Any,
    seq_len: int,
    batch_size: int,
    read_threads: int | None = None,
) -> Any:
    """Grain's ``map`` of the per-record encoding, ``ConcatThenSplitIterDataset``, ``batch``.

    ``read_threads``: Grain's read threads, which run the map (``None``: its default).
    """
    import grain
    from grain.experimental import ConcatThenSplitIterDataset

    options = (
        grain.ReadOptions() if read_threads is None else grain.ReadOptions(num_threads=read_threads)
    )
    ds = (
        grain.MapDataset.source(records)
        .shuffle(seed=0)
        .repeat()
        .map(OneByOne(TokenizeTransform(tokenizer, eos_id=EOS)))
        .to_iter_dataset(options)
    )
    ds = ConcatThenSplitIterDataset(ds, length_struct={"tokens": seq_len})
    return iter(ds.batch(batch_size, drop_remainder=True))


class EncodeBatch:
    """``TokenizeTransform.apply_batch`` as a plain function: one encode call per batch of
    records, the call zephon_jax's ``tokenize`` makes per block."""

    def __init__(self, transform: TokenizeTransform):
        self.transform = transform

    def __call__(self, records: list) -> list:
        return self.transform.apply_batch(records, [()] * len(records))


def grain_batched_pipeline(
    records: list[dict],
    tokenizer: Any,
    seq_len: int,
    batch_size: int,
    encode_batch: int = 256,
) -> Any:
    """Grain with batched encoding: ``batch(encode_batch) -> map(encode the batch) ->
    unbatch`` (a ``FlatMapTransform``), ``read_threads=0``, then as ``grain_pipeline``."""
    import grain
    from grain.experimental import ConcatThenSplitIterDataset, FlatMapIterDataset

    ds = (
        grain.MapDataset.source(records)
        .shuffle(seed=0)
        .repeat()
        .batch(encode_batch, drop_remainder=True, batch_fn=list)
        .map(EncodeBatch(TokenizeTransform(tokenizer, eos_id=EOS)))
        .to_iter_dataset(grain.ReadOptions(num_threads=0))
    )
    ds = FlatMapIterDataset(ds, Unbatch(encode_batch))
    ds = ConcatThenSplitIterDataset(ds, length_struct={"tokens": seq_len})
    return iter(ds.batch(batch_size, drop_remainder=True))


class Unbatch(FlatMapTransform):
    """Grain's unbatch as a ``FlatMapTransform``: a list of records -> the records."""

    def __init__(self, max_fan_out: int):
        self.max_fan_out = max_fan_out

    def flat_map(self, element: list) -> list:
        return element


def pipeline_rates(make_iterator, timing) -> dict:
    warmup_s, window_s, windows = timing
    it = make_iterator()
    tally = PackedTally()
    try:
        r = _timed_windows(it, tally, warmup_s=warmup_s, window_s=window_s, windows=windows)
    finally:
        _close(it)
    tokens_per_record = r["units"] / tally.records
    return {
        "tokens_per_s": r["rate_median"],
        "records_per_s": r["rate_median"] / tokens_per_record,
        "tokens_per_record": tokens_per_record,
    }


def run(kind: str, tokenizer: Any, texts: list[str], args, timing) -> dict:
    records = [{"text": t} for t in texts]
    transform = TokenizeTransform(tokenizer, eos_id=EOS)

    def zephon(batched: bool):
        ds = zephon_pipeline(records, tokenizer, args.seq_len, args.batch_size, batched)
        return lambda: iter(zj.Loader(ds))

    def grain_iterator():
        return grain_pipeline(records, tokenizer, args.seq_len, args.batch_size)

    result = {"encode": encode_only(transform, texts, timing)}
    result["batched"] = pipeline_rates(zephon(True), timing)
    result["one_by_one"] = pipeline_rates(zephon(False), timing)
    result["grain"] = pipeline_rates(grain_iterator, timing)
    result["batched_over_one_by_one"] = (
        result["batched"]["tokens_per_s"] / result["one_by_one"]["tokens_per_s"]
    )
    result["batched_over_grain"] = (
        result["batched"]["tokens_per_s"] / result["grain"]["tokens_per_s"]
    )
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short windows (smoke run)")
    parser.add_argument("--seconds", type=float, default=None, help="time per measurement")
    parser.add_argument("--num-texts", type=int, default=20_000)
    parser.add_argument("--min-words", type=int, default=20, help="shortest text, in words")
    parser.add_argument("--max-words", type=int, default=400, help="longest text, in words")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help="comma-separated tokenizer libraries",
    )
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    timing = _timing(args.quick, args.seconds)
    texts = make_texts(args.num_texts, args.min_words, args.max_words)
    tokenizers = train_tokenizers(texts, tuple(args.kinds.split(",")))
    results = {}
    print(f"{'tokenizer':<14} {'mode':<11} {'records/s':>11} {'tokens/s':>12}")
    for kind in args.kinds.split(","):
        r = results[kind] = run(kind, tokenizers[kind], texts, args, timing)
        e = r["encode"]
        print(f"{kind:<14} {'encode x256':<11} {e['batched_records_per_s']:>11,.0f} {'':>12}")
        print(
            f"{'':<14} {'encode x1':<11} {e['one_by_one_records_per_s']:>11,.0f} {'':>12}"
            f"   batched/one-by-one {e['ratio']:.2f}x"
        )
        for mode in ("batched", "one_by_one", "grain"):
            m = r[mode]
            print(f"{'':<14} {mode:<11} {m['records_per_s']:>11,.0f} {m['tokens_per_s']:>12,.0f}")
        print(
            f"{'':<14} pipeline batched/one-by-one {r['batched_over_one_by_one']:.2f}x, "
            f"batched/grain {r['batched_over_grain']:.2f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
