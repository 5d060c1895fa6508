"""The grounding store's entry point: `GroundingStore.open` reuses the store of a grounder's
template and data when its fingerprint matches and its contents check, else (re)builds it;
`detach` and `attach` hand an open store to another process (a training rank)."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import time
import weakref
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from relsql.ground.demand import BatchGrounder, PreparedRule
from relsql.ground.store.folder import claim, clear, follower, locked, wait_for
from relsql.ground.store.layout import Damaged, StoreMeta, damaged, file_name, fingerprint
from relsql.ground.store.manifest import check_against, check_manifest, current, read_manifest, verify_files
from relsql.ground.store.memory import resident_budget
from relsql.ground.store.read import BatchReader, Parts, StoredRule
from relsql.ground.store.write import build_store, float_type
from relsql.template import ir

log = logging.getLogger("relsql")


class GroundingStore(BatchReader):
    """Bulk groundings on disk, read per batch in O(batch). Use `GroundingStore.open`."""

    def __init__(self, grounder: BatchGrounder, folder: Path, manifest: dict, owned: bool,
                 verify: bool = False, created: bool = False):
        self.grounder, self.folder, self.manifest = grounder, folder, manifest
        self.template, self.output, self.order = grounder.template, grounder.output, grounder.order
        self.fanout, self.seed = grounder.fanout, grounder.seed
        self.created = created  # relsql made the folder (the damaged-store message may advise deleting it)
        super().__init__()
        self.rules = {}
        if owned:  # a temporary store goes with the model that made it
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(folder), True)
        try:
            self.data = folder / check_manifest(manifest)
            check_against(manifest, grounder)
            if verify:
                verify_files(self.data, manifest["files"])
            for name in self.order:
                described = manifest["relations"][name]["rules"]
                self.rules[name] = [self._open_rule(prepared, described[str(prepared.index)])
                                    for prepared in grounder.prepared[name]]
            self.embedding_keys = {w: self._keys(f"{file_name(w)}.keys.arrow") for w in grounder.stored}
            self.resident_budget = resident_budget(sum(v["bytes"] for v in self.sizes.values()))
        except Damaged as err:
            raise damaged(self.folder, str(err), self.created) from None

    # -- opening -------------------------------------------------------------------------------
    def detach(self) -> tuple[str, dict, StoreMeta]:
        """(folder, manifest, meta): enough to open this store in another process with `attach`."""
        g = self.grounder
        meta = StoreMeta(g.template, g.output, list(g.order), g.fanout, g.seed, g.prepared, dict(g.stored),
                         dict(g.dictionary_tables), dict(g.feature_stats), dict(g.sizes))
        return str(self.folder), self.manifest, meta

    @classmethod
    def attach(cls, folder: str, manifest: dict, meta: StoreMeta) -> GroundingStore:
        """A store opened read-only by a process that has no database (its owner removes it)."""
        return cls(meta, Path(folder), manifest, owned=False, verify=True)

    @classmethod
    def open(cls, grounder: BatchGrounder, folder: str | Path | None = None, progress: bool | None = None,
             dtype: torch.dtype | None = None) -> GroundingStore:
        """The store of `grounder`'s template and data in `folder` (a temporary one when None):
        reused when its fingerprint matches the data and its contents check, else (re)built.
        Never used stale; a folder that is neither empty (or new) nor marked as a store is refused.
        `dtype`: the float type of the net that reads it; torch.float32 keeps values as float32
        (half the bytes, and what such a net rounds them to anyway); None or float64 keeps float64.
        Batches always hand out float64 values and int64 ids and codes, whatever the files hold."""
        floats = float_type(dtype)
        if folder is None:  # nothing to compare with: no fingerprint (it reads every table once more)
            path = Path(tempfile.mkdtemp(prefix="relsql-store-"))
            try:
                return cls(grounder, path, build_store(grounder, path, "", progress, floats), owned=True)
            except BaseException:
                shutil.rmtree(path, ignore_errors=True)
                raise
        path = Path(folder)
        mark = fingerprint(grounder) + ("" if floats == "float64" else f"/{floats}")
        if follower():  # a torchrun rank other than 0: rank 0 writes the shared store, this one waits for it
            return cls(grounder, path, wait_for(path, mark), owned=False, verify=True)
        created = claim(path)
        manifest = read_manifest(path, created)
        if not current(manifest, mark):
            with locked(path):  # one build at a time; another process may have built it meanwhile
                manifest = read_manifest(path, created)
                if not current(manifest, mark):
                    if manifest is not None:
                        log.info("grounding store %s was built from other data or another template; rebuilding", path)
                    clear(path)
                    manifest = build_store(grounder, path, mark, progress, floats)
        return cls(grounder, path, manifest, owned=False, verify=True, created=created)

    def _open_rule(self, prepared: PreparedRule, described: dict) -> StoredRule:
        size, rows, parts = described["groundings"], described["rows"], described["parts"]
        offsets = self.mapped(f"{described['stem']}.offsets", np.int64, (rows + 1,))
        if int(offsets[0]) != 0 or int(offsets[-1]) != size:
            raise Damaged(f"{described['stem']}.offsets does not run from 0 to the rule's {size:,} groundings")

        def column(suffix: str, dtype, width: int | None) -> np.ndarray | Parts:
            arrays = [self.mapped(f"{part['stem']}.{suffix}", dtype, (part["groundings"],) if width is None
                                  else (part["groundings"], width)) for part in parts]
            if len(arrays) == 1:
                return arrays[0]
            return Parts(arrays) if arrays else np.zeros((0,) if width is None else (0, width), dtype)

        dtypes = described["dtypes"]
        refs = [column(f"r{j}", np.dtype(dtypes[f"r{j}"]), None) for j in range(len(prepared.rule.refs))]
        columns = {int(k): column(f"c{k}", np.dtype(dtypes[f"c{k}"]), None if kind == "code" else width)
                   for k, (kind, width) in described["columns"].items()}
        return StoredRule(prepared, size, offsets, refs, columns, ir.coded_columns(prepared.rule))

    def _keys(self, file: str) -> pa.Array:
        """A database-stored embedding's raw keys, by code."""
        path = self.data / file
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                raise Damaged(f"{file} is not a regular file")
            return pa.ipc.open_file(pa.memory_map(str(path))).read_all().column(0)
        except (OSError, pa.ArrowException, IndexError) as err:
            raise Damaged(f"{file}: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}") from None

    @property
    def sizes(self) -> dict[str, dict]:
        """Per relation: rows, groundings and bytes on disk (for explain)."""
        result = {}
        for name in self.order:
            described = self.manifest["relations"][name]
            result[name] = {"rows": described["rows"], "groundings": sum(r["groundings"] for r in described["rules"].values()),
                            "bytes": described["bytes"]}
        return result

    def describe(self, batch_size: int, batches: int = 3, seed: int = 0) -> str:
        """The store's sizes per relation and the work of a batch of `batch_size` output rows
        (rows and groundings read, seconds), measured on `batches` random batches."""
        rng = np.random.default_rng(seed)
        total = self.grounder.sizes[self.output]
        read: dict[str, list[tuple[int, int]]] = {name: [] for name in self.order}
        seconds = []
        for _ in range(batches):
            rows = rng.choice(total, min(batch_size, total), replace=False)
            started = time.perf_counter()
            batch = self.ground(rows)
            seconds.append(time.perf_counter() - started)
            for name in self.order:
                relation = batch.relations.get(name)
                read[name].append((0, 0) if relation is None else (relation.size, sum(r.size for r in relation.rules)))
        lines = [f"-- grounding store {self.folder}: {sum(v['bytes'] for v in self.sizes.values()) / 2**20:,.1f} MiB",
                 f"  {'relation':<24} {'rows':>12} {'groundings':>12} {'MiB':>9} | {'batch rows':>11} {'batch groundings':>17}",
                 f"  {'':<60} | (per batch of {batch_size:,}, mean)"]
        for name, size in self.sizes.items():
            rows = np.mean([r for r, _ in read[name]])
            groundings = np.mean([g for _, g in read[name]])
            lines.append(f"  {name:<24} {size['rows']:>12,} {size['groundings']:>12,} {size['bytes'] / 2**20:>9,.1f} |"
                         f" {rows:>11,.0f} {groundings:>17,.0f}")
        lines.append(f"  a batch reads its groundings from the store in {np.median(seconds) * 1000:,.1f} ms "
                     f"(median of {batches}); {max(1, -(-total // batch_size)):,} batches per pass over {total:,} rows")
        return "\n".join(lines)


__all__ = ["GroundingStore"]
