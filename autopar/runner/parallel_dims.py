"""The device mesh of one layout, torchtitan's ParallelDims idea: dims (pp, dp_replicate, dp_shard,
cp, tp), row-major over ranks; only dims of size > 1 become mesh dims."""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autopar.layout import Layout
from autopar.runner.checks import mesh_shape

DIM_NAMES: tuple[str, ...] = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@dataclass
class ParallelDims:
    sizes: dict[str, int]
    rank: int
    mesh: DeviceMesh | None = None

    @classmethod
    def from_layout(cls, layout: Layout, rank: int) -> ParallelDims:
        return cls(mesh_shape(layout), rank)

    @property
    def world_size(self) -> int:
        n = 1
        for v in self.sizes.values():
            n *= v
        return n

    @property
    def dp(self) -> int:
        return self.sizes["dp_replicate"] * self.sizes["dp_shard"]

    def build_mesh(self, device_type: str) -> DeviceMesh | None:
        names = tuple(n for n in DIM_NAMES if self.sizes[n] > 1)
        if names:
            self.mesh = init_device_mesh(
                device_type, tuple(self.sizes[n] for n in names), mesh_dim_names=names
            )
        return self.mesh

    def get(self, *names: str) -> DeviceMesh | None:
        """The sub-mesh over those of ``names`` whose size is > 1, or None if there is none."""
        kept = tuple(n for n in names if self.sizes[n] > 1)
        if not kept or self.mesh is None:
            return None
        return self.mesh[kept] if len(kept) > 1 else self.mesh[kept[0]]

    def coord(self, name: str) -> int:
        """This rank's index along one dim (row-major, as init_device_mesh lays ranks out)."""
        stride = 1
        for n in reversed(DIM_NAMES):
            if n == name:
                return (self.rank // stride) % self.sizes[n]
            stride *= self.sizes[n]
        raise KeyError(name)

    @property
    def dp_rank(self) -> int:
        return self.coord("dp_replicate") * self.sizes["dp_shard"] + self.coord("dp_shard")
