# SPDX-License-Identifier: BSD-3-Clause
"""Reads tests/deepep/ll_matrix.sh's logs (OUT/<config>/{gda,p2p}.log) and prints deepep-ll.csv.

    python3 tests/deepep/ll_csv.py [--ranks N] [--gpus G] [--label L] OUT

Each figure is the mean over ranks of the rank's own avg_t as DeepEP's test prints it
("Dispatch + combine bandwidth: ... avg_t=", "Dispatch bandwidth ... avg_t= | Combine bandwidth ...
avg_t=", "Dispatch send/recv time: S + R us | Combine send/recv time: S + R us"). A log without
those lines (a failed run) gives no row.
"""
import argparse
import os
import re
import sys

P_DC = re.compile(r'\[rank (\d+)\] Dispatch \+ combine bandwidth: .*avg_t=([\d.]+) us')
P_SEP = re.compile(r'\[rank (\d+)\] Dispatch bandwidth: .*avg_t=([\d.]+) us \| Combine bandwidth: .*avg_t=([\d.]+) us')
P_SR = re.compile(r'\[rank (\d+)\] Dispatch send/recv time: ([\d.]+) \+ ([\d.]+) us \| Combine send/recv time: ([\d.]+) \+ ([\d.]+) us')


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def parse(path):
    dc, d, c, ds, cs = [], [], [], [], []
    passed = False
    with open(path, errors='replace') as f:
        for line in f:
            if m := P_DC.search(line):
                dc.append(float(m.group(2)))
            elif m := P_SEP.search(line):
                d.append(float(m.group(2)))
                c.append(float(m.group(3)))
            elif m := P_SR.search(line):
                ds.append(float(m.group(2)))
                cs.append(float(m.group(4)))
    if not dc:
        return None
    return [mean(d), mean(c), mean(dc), mean(ds), mean(cs)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--ranks', type=int, default=2)
    ap.add_argument('--gpus', type=int, default=2)
    ap.add_argument('--label', default='')
    ap.add_argument('out')
    a = ap.parse_args()
    cols = 'config,path,ranks,gpus,dispatch_us,combine_us,dispatch_combine_us,dispatch_send_us,combine_send_us'
    print(cols + (',label' if a.label else ''))
    for cfg in sorted(os.listdir(a.out)):
        for path in ('gda', 'p2p'):
            log = os.path.join(a.out, cfg, f'{path}.log')
            if not os.path.isfile(log):
                continue
            r = parse(log)
            if r is None:
                print(f'll_csv.py: {log}: no timings (run failed?)', file=sys.stderr)
                continue
            vals = ','.join('' if v is None else f'{v:.2f}' for v in r)
            print(f'{cfg},{path},{a.ranks},{a.gpus},{vals}' + (f',{a.label}' if a.label else ''))


if __name__ == '__main__':
    main()
