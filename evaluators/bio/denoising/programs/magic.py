"""MAGIC-style denoising by diffusion on a cell graph (van Dijk et al., Cell 2018), the initial state.

Written from the method's description, in the form every candidate takes: `magic_denoise(X, **kwargs)`
receives the train counts (cells x genes) and returns denoised counts of the same shape.

1. Transform and normalise in the "reversed" order OpenProblems found best for its Poisson metric:
   square root of the counts first, then each cell divided by its total (its library size).
2. Principal components of the normalised cells (100 by default).
3. A k-nearest-neighbour graph in that space with MAGIC's adaptive alpha-decay kernel:
   K(i, j) = exp(-(d(i, j) / sigma_i) ** decay), sigma_i the distance from cell i to its k-th
   nearest neighbour (counting the cell itself), symmetrised as (K + K^T) / 2, with weights under
   1e-4 dropped and neighbours searched up to knn_max.
4. The Markov matrix M = D^-1 K (rows sum to 1), applied t times to the cells' principal
   components: diffusion shares information between similar cells.
5. Back to genes through the principal axes, then the transform undone: squared, multiplied by
   each cell's library size.
"""

import numpy as np
import scipy.sparse as sp
from sklearn.decomposition import PCA
from sklearn.neighbors import NearestNeighbors


def alpha_decay_kernel(Z, knn, knn_max, decay, thresh=1e-4):
    """MAGIC's adaptive kernel over the knn_max nearest neighbours of each row of Z (sparse, symmetric)."""
    n = Z.shape[0]
    k_search = min(n, knn_max)
    distances, neighbours = NearestNeighbors(n_neighbors=k_search).fit(Z).kneighbors(Z)
    sigma = distances[:, min(knn, k_search) - 1]  # distance to the k-th neighbour, the cell itself first
    sigma[sigma == 0] = np.finfo(float).eps
    weights = np.exp(-((distances / sigma[:, None]) ** decay))
    weights[weights < thresh] = 0.0
    rows = np.repeat(np.arange(n), k_search)
    K = sp.csr_matrix((weights.ravel(), (rows, neighbours.ravel())), shape=(n, n))
    K = (K + K.T) / 2.0
    K.eliminate_zeros()
    return K


def magic_denoise(X, knn=5, knn_max=None, decay=1.0, t=3, n_pca=100, random_state=None, **kwargs):
    X = np.asarray(X, dtype=np.float64)
    n_cells, n_genes = X.shape
    knn_max = 3 * knn if knn_max is None else knn_max

    # 1. square root, then library-size normalisation (OpenProblems' "reversed" order)
    root = np.sqrt(X)
    libsize = root.sum(axis=1)
    libsize[libsize == 0] = 1.0
    normalised = root / libsize[:, None]

    # 2. principal components
    n_components = min(n_pca, n_cells - 1, n_genes)
    pca = PCA(n_components=n_components, svd_solver="randomized", random_state=random_state)
    Z = pca.fit_transform(normalised)

    # 3-4. adaptive kernel, Markov matrix, t diffusion steps in PCA space
    K = alpha_decay_kernel(Z, knn, knn_max, decay)
    M = sp.diags(1.0 / np.asarray(K.sum(axis=1)).ravel()) @ K
    for _ in range(t):
        Z = M @ Z

    # 5. back to genes, undo the transform
    smoothed = pca.inverse_transform(Z)
    return np.square(smoothed) * libsize[:, None]
