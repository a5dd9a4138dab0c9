// An honest AHC058 program written the way contest programs are: fast input, a random engine
// seeded from std::random_device, a steady_clock time budget, clock() for CPU time, a helper
// thread, then T actions. Its plan is the simple one of tests/test_ahc_sandbox.py (buy 0 0 once,
// then wait), so its score is known: round(1e5 * log2(500)) per case.
#include <bits/stdc++.h>
using namespace std;

int main() {
    ios::sync_with_stdio(false);
    cin.tie(nullptr);
    int n, l, t;
    long long k;
    cin >> n >> l >> t >> k;
    vector<long long> rest;
    for (long long x; cin >> x;) rest.push_back(x);
    random_device device;
    mt19937_64 rng(device());
    auto start = chrono::steady_clock::now();
    clock_t cpu0 = clock();
    atomic<unsigned long long> helper{0};
    thread worker([&] {
        unsigned long long s = 0;
        for (int i = 0; i < 2000000; i++) s += (unsigned long long)i * 2654435761ULL;
        helper = s;
    });
    double acc = 0;
    while (chrono::duration<double>(chrono::steady_clock::now() - start).count() < 0.15) acc += rng() % 7;
    worker.join();
    string out;
    for (int i = 0; i < t; i++) out += (i == 0 ? "0 0\n" : "-1\n");
    cout << out;
    cerr << "work " << acc << " helper " << helper.load() << " cpu " << double(clock() - cpu0) / CLOCKS_PER_SEC << " inputs " << rest.size() << "\n";
    return 0;
}
