"""Run variant placement policies through libs.sim.fgd by monkeypatching libs.core.fit.choose.
usage: harness.py VARIANT LIST[,LIST..] SEED[,SEED..]   -> one JSON line per (list, seed)"""
import sys, json, time, os
sys.path.insert(0, os.path.dirname(__file__))
import numpy as np
import libs.core.fit as fit
import libs.sim.fgd as F
import policies

variant, lists, seeds = sys.argv[1], sys.argv[2].split(','), [int(s) for s in sys.argv[3].split(',')]
if variant != 'orig':
    fit.choose = policies.make(variant)
for lst in lists:
    policies.load_shape_mem(f'/work/shared/data/openb/openb_pod_list_{lst}.csv')
    for seed in seeds:
        t = time.time()
        s = F.simulate(f'/work/shared/data/openb/openb_pod_list_{lst}.csv', F.DEFAULT_NODES, 'fgd', [seed], 1.3)
        j = s.as_json()
        print(json.dumps({'variant': variant, 'list': lst, 'seed': seed, 'unalloc': j['unallocated_pct_at_100'],
                          'u130': round(100 - j['alloc_pct']['130'], 2), 'sec': round(time.time() - t, 1)}), flush=True)
