#!/usr/bin/env python3
# WAL frame census: how many frames each commit wrote and which B-tree each frame's page
# belongs to (through dbstat), for the "where the bytes are" figures of docs/benchmarks-analysis.md.
# usage: scripts/wal-census.py DB WAL   (DB: a copy of the database with that WAL beside it;
# take both from a relay killed with kill -9, so no checkpoint emptied the WAL)
import struct, sys, subprocess, collections
db, wal = sys.argv[1], sys.argv[2]
data = open(wal, 'rb').read()
magic, ver, psz, seq, s1, s2, c1, c2 = struct.unpack('>8I', data[:32])
big = magic & 1
def cks(buf, a, b):
    fmt = ('>' if big else '<') + '%dI' % (len(buf) // 4)
    w = struct.unpack(fmt, buf)
    for i in range(0, len(w), 2):
        a = (a + w[i] + b) & 0xffffffff
        b = (b + w[i + 1] + a) & 0xffffffff
    return a, b
a, b = cks(data[:24], 0, 0)
assert (a, b) == (c1, c2), 'bad header checksum'
off = 32; fsz = 24 + psz
commits = []; cur = []; frames = 0
while off + fsz <= len(data):
    pg, commit, fs1, fs2, fc1, fc2 = struct.unpack('>6I', data[off:off + 24])
    if (fs1, fs2) != (s1, s2): break
    a, b = cks(data[off:off + 8], a, b)
    a, b = cks(data[off + 24:off + fsz], a, b)
    if (a, b) != (fc1, fc2): break
    cur.append(pg); frames += 1
    if commit: commits.append(cur); cur = []
    off += fsz
owner = {}
out = subprocess.run(['sqlite3', db, 'SELECT pageno, name FROM dbstat'], capture_output=True, text=True).stdout
for line in out.splitlines():
    p, n = line.split('|', 1); owner[int(p)] = n
owner[1] = 'page1 (header + sqlite_schema)' if 1 not in owner else owner[1] + ' (page 1)'
per = collections.Counter(); distinct = set(); distinct_by = collections.defaultdict(set)
for c in commits:
    for p in c:
        per[owner.get(p, 'free/unknown')] += 1; distinct.add(p); distinct_by[owner.get(p, 'free/unknown')].add(p)
n = len(commits)
print(f'{n} commits, {sum(len(c) for c in commits)} frames in commits, {len(distinct)} distinct pages; frames/commit {sum(len(c) for c in commits)/max(n,1):.1f}')
print(f'{"btree":40} {"frames/commit":>14} {"distinct pages":>15} {"commits touching":>17}')
touch = collections.Counter()
for c in commits:
    for name in set(owner.get(p, 'free/unknown') for p in c): touch[name] += 1
for name, k in per.most_common():
    print(f'{name:40} {k/n:14.2f} {len(distinct_by[name]):15} {touch[name]:17}')
