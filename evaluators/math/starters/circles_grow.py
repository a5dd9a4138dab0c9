"""Starter for circle packing (ours; the paper's circle runs start from no program): keep the
parent's centres and grow every circle into the room its walls and neighbours leave."""

import numpy as np


def construct(parent):
    c = np.array(parent, dtype=float)  # the state's packing: n rows [x, y, r]
    xy, r = c[:, :2], c[:, 2].copy()
    wall = np.minimum(xy, 1.0 - xy).min(axis=1)
    dist = np.linalg.norm(xy[:, None, :] - xy[None, :, :], axis=2)
    np.fill_diagonal(dist, np.inf)
    for _ in range(20):
        for i in range(len(r)):
            room = min(wall[i], (dist[i] - r).min())
            r[i] = max(r[i], room * (1.0 - 1e-12))  # a hair below the room: the check is exact
    return np.column_stack([xy, r]).tolist()
