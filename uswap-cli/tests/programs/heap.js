// JS arrays of small integers (V8's heap) and Buffers (outside it), MIB MiB of each kind in
// all, written, then read back twice with every element checked; prints a checksum.
// Usage: node heap.js MIB
const mib = parseInt(process.argv[2]);
const per = 32768; // 32768 small integers: 256 KiB of V8 heap per array
const arrays = [], buffers = [];
for (let i = 0; i < mib * 4; i++) {
  const a = new Array(per);
  for (let j = 0; j < per; j++) a[j] = (i * 7 + j) % 1000003;
  arrays.push(a);
  const b = Buffer.alloc(256 << 10);
  for (let j = 0; j < b.length; j += 64) b[j] = (i + j) & 0xff;
  buffers.push(b);
}
let sum = 0;
for (let pass = 0; pass < 2; pass++) {
  arrays.forEach((a, i) => {
    for (let j = 0; j < per; j++) {
      if (a[j] !== (i * 7 + j) % 1000003) { console.error(`wrong element ${i}/${j}`); process.exit(3); }
      sum = (sum + a[j] + pass) % 1000000007;
    }
  });
  buffers.forEach((b, i) => {
    for (let j = 0; j < b.length; j += 64) {
      if (b[j] !== ((i + j) & 0xff)) { console.error(`wrong byte ${i}/${j}`); process.exit(3); }
      sum = (sum + b[j]) % 1000000007;
    }
  });
}
console.log("checksum", sum);
