// Checks the generated C header (include/nvshmem_efa_gda.h) against
// tests/golden/gda_state_layout.txt, the file the Rust side is checked with
// (tests/efa_golden_state.rs): every field's offset and size, every struct's size, the version.
// Host code only (also compiles as plain C++).
//
//   nvcc -std=c++17 -x cu -Iinclude tests/cuda/gda_state_layout_test.cu -o /tmp/gda_layout
//   /tmp/gda_layout tests/golden/gda_state_layout.txt
//
// Exit status 0 and a last line "N passed, 0 failed" on success.
#include "nvshmem_efa_gda.h"

#include <cstddef>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>

namespace {

struct Field {
    size_t off, size;
};

#define F(S, f) {{#S, #f}, {offsetof(S, f), sizeof(((S *)nullptr)->f)}}
#define Z(S) {#S, sizeof(S)}

const std::map<std::pair<std::string, std::string>, Field> kFields = {
    F(NvshmemEfaGdaDeviceState, version), F(NvshmemEfaGdaDeviceState, ready),
    F(NvshmemEfaGdaDeviceState, my_pe), F(NvshmemEfaGdaDeviceState, n_pes),
    F(NvshmemEfaGdaDeviceState, queue), F(NvshmemEfaGdaDeviceState, heap_base),
    F(NvshmemEfaGdaDeviceState, heap_size), F(NvshmemEfaGdaDeviceState, heap_lkey),
    F(NvshmemEfaGdaDeviceState, reserved), F(NvshmemEfaGdaDeviceState, peers),
    F(NvshmemEfaGdaDeviceState, heap_keys), F(NvshmemEfaGdaDeviceState, log2_granularity),
    F(NvshmemEfaGdaDeviceState, key_stride), F(NvshmemEfaGdaDeviceState, n_granules),
    F(NvshmemEfaGdaDeviceState, reserved2), F(NvshmemEfaGdaDeviceState, queues),
    F(NvshmemEfaGdaDeviceState, n_queues), F(NvshmemEfaGdaDeviceState, queues_per_pe),
    F(NvshmemEfaGdaQueue, sq), F(NvshmemEfaGdaQueue, sq_doorbell), F(NvshmemEfaGdaQueue, cq),
    F(NvshmemEfaGdaQueue, rx_cq), F(NvshmemEfaGdaQueue, ctrl), F(NvshmemEfaGdaQueue, slot_status),
    F(NvshmemEfaGdaQueue, host_ctrl), F(NvshmemEfaGdaQueue, sq_entries),
    F(NvshmemEfaGdaQueue, sq_entry_size), F(NvshmemEfaGdaQueue, cq_entries),
    F(NvshmemEfaGdaQueue, cq_entry_size), F(NvshmemEfaGdaQueue, rx_entries),
    F(NvshmemEfaGdaQueue, max_batch), F(NvshmemEfaGdaQueue, qpn), F(NvshmemEfaGdaQueue, reserved),
    F(NvshmemEfaGdaQueue, mode),
    F(NvshmemEfaGdaQueueCtrl, resv), F(NvshmemEfaGdaQueueCtrl, ready),
    F(NvshmemEfaGdaQueueCtrl, done), F(NvshmemEfaGdaQueueCtrl, cq_ci),
    F(NvshmemEfaGdaQueueCtrl, errors), F(NvshmemEfaGdaQueueCtrl, first_error),
    F(NvshmemEfaGdaQueueCtrl, cq_lock), F(NvshmemEfaGdaQueueCtrl, rx_ci),
    F(NvshmemEfaGdaQueueCtrl, rung), F(NvshmemEfaGdaQueueCtrl, db_lock),
    F(NvshmemEfaGdaHostCtrl, consumed), F(NvshmemEfaGdaHostCtrl, rejected),
    F(NvshmemEfaGdaHostCtrl, rx_produced), F(NvshmemEfaGdaHostCtrl, heartbeat),
    F(NvshmemEfaGdaHostCtrl, stopped), F(NvshmemEfaGdaHostCtrl, done),
    F(NvshmemEfaGdaHostCtrl, pad),
    F(NvshmemEfaGdaPeer, ahn), F(NvshmemEfaGdaPeer, qpn), F(NvshmemEfaGdaPeer, qkey),
    F(NvshmemEfaGdaPeer, heap_base), F(NvshmemEfaGdaPeer, heap_size),
    F(NvshmemEfaGdaPeer, heap_rkey), F(NvshmemEfaGdaPeer, flags),
};

const std::map<std::string, size_t> kSizes = {
    Z(NvshmemEfaGdaDeviceState), Z(NvshmemEfaGdaQueue), Z(NvshmemEfaGdaQueueCtrl),
    Z(NvshmemEfaGdaHostCtrl), Z(NvshmemEfaGdaPeer),
};

}  // namespace

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "tests/golden/gda_state_layout.txt";
    std::ifstream in(path);
    if (!in) {
        fprintf(stderr, "cannot open %s\n", path);
        return 2;
    }
    int passed = 0, failed = 0, fields = 0, sizes = 0, lineno = 0;
    bool version_seen = false;
    std::string line;
    while (std::getline(in, line)) {
        ++lineno;
        std::istringstream ls(line);
        std::string a, b, c, d;
        if (!(ls >> a) || a[0] == '#') continue;
        bool ok = false;
        if (a == "version" && (ls >> b)) {
            version_seen = true;
            ok = std::stoul(b) == NVSHMEM_EFA_GDA_STATE_VERSION;
        } else if ((ls >> b >> c) && b == "sizeof") {
            auto it = kSizes.find(a);
            ok = it != kSizes.end() && it->second == std::stoul(c);
            ++sizes;
        } else if (ls >> d) {
            auto it = kFields.find({a, b});
            ok = it != kFields.end() && it->second.off == std::stoul(c) &&
                 it->second.size == std::stoul(d);
            ++fields;
        }
        if (ok) {
            ++passed;
        } else {
            ++failed;
            fprintf(stderr, "%s:%d: mismatch: %s\n", path, lineno, line.c_str());
        }
    }
    if (!version_seen || fields != (int)kFields.size() || sizes != (int)kSizes.size()) {
        fprintf(stderr, "%s: %d field lines for %zu fields, %d sizeof lines for %zu structs%s\n",
                path, fields, kFields.size(), sizes, kSizes.size(),
                version_seen ? "" : ", no version line");
        ++failed;
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
