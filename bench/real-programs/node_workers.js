// Node.js with worker threads, for `uswap bench --command`: the main thread and two workers
// (three V8 isolates) each build an array of 1.5M random strings of about 100 characters
// and hash them twice with MD5; prints the three digests (the same on every run). About
// 4.8 GB resident when run plain. V8 makes each 256 KiB page of a heap a mapping of its own:
// some 10,000 at once here, which is what this measures under a limit.
//   sudo uswap bench --command "node --max-old-space-size=4096 bench/real-programs/node_workers.js" \
//       --engines uswap-signal,kernel-zram --limit 1GiB --runs 3
// (--max-old-space-size: Node sizes its heaps from a memory cgroup's limit, which the kernel
// engines set, and would otherwise stop with "heap out of memory" there only.)
const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');
const crypto = require('crypto');
function work(seed, n) {
  let x = seed >>> 0;
  const rnd = () => (x = (x * 1103515245 + 12345) >>> 0);
  const arr = [];
  for (let i = 0; i < n; i++) {
    let s = '';
    for (let k = 0; k < 16; k++) s += rnd().toString(36);
    arr.push(s + i);
    if (i % 50000 === 0 && arr.length > 100000) arr.splice(0, 1000);
  }
  const h = crypto.createHash('md5');
  for (let pass = 0; pass < 2; pass++) for (const s of arr) h.update(s);
  return h.digest('hex');
}
if (isMainThread) {
  const ws = [1, 2].map(i => new Promise((res, rej) => {
    const w = new Worker(__filename, { workerData: i });
    w.on('message', res); w.on('error', rej);
  }));
  const mine = work(7, 1500000);
  Promise.all(ws).then(r => console.log(mine, r.join(' ')));
} else {
  parentPort.postMessage(work(workerData * 1000, 1500000));
}
