// A simple valid start for AHC039 (our own; the paper started from a strong published program):
// the best axis-aligned rectangle on a 250 x 250 grid of cells, found with prefix sums over rows
// and Kadane's algorithm over columns, O(G^3). Every rectangle is a valid net (4 distinct
// vertices, perimeter at most 4e5), so the program never fails a case.
#include <bits/stdc++.h>
using namespace std;

int main() {
    int n;
    if (!(cin >> n)) return 0;
    const int G = 250, MAXC = 100000, CELL = MAXC / G;  // 400 units per cell
    vector<vector<int>> w(G, vector<int>(G, 0));          // mackerels minus sardines per cell
    for (int i = 0; i < 2 * n; i++) {
        int x, y;
        cin >> x >> y;
        w[min(x / CELL, G - 1)][min(y / CELL, G - 1)] += (i < n) ? 1 : -1;
    }
    long long best = LLONG_MIN;
    int bx1 = 0, bx2 = 0, by1 = 0, by2 = 0;
    vector<long long> col(G);
    for (int x1 = 0; x1 < G; x1++) {
        fill(col.begin(), col.end(), 0);
        for (int x2 = x1; x2 < G; x2++) {
            for (int y = 0; y < G; y++) col[y] += w[x2][y];
            long long run = 0;
            int start = 0;
            for (int y = 0; y < G; y++) {  // Kadane over the cells' y index
                if (run <= 0) { run = 0; start = y; }
                run += col[y];
                if (run > best) { best = run; bx1 = x1; bx2 = x2; by1 = start; by2 = y; }
            }
        }
    }
    int ax = bx1 * CELL, bx = min(MAXC, (bx2 + 1) * CELL), ay = by1 * CELL, by = min(MAXC, (by2 + 1) * CELL);
    cerr << "best rectangle estimate " << best << "\n";
    cout << 4 << "\n" << ax << " " << ay << "\n" << bx << " " << ay << "\n" << bx << " " << by << "\n" << ax << " " << by << "\n";
    return 0;
}
