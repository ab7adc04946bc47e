'use strict';
// The registry these machines reach carries only the platform packages of
// @napi-rs/{lzma,tar,wasm-tools} for this platform, so `npm install` leaves
// the others out of package-lock.json while their parents still list them,
// and `npm ci` then calls the lock out of sync. After regenerating the lock,
// run this to drop the optional dependencies the lock holds no entry for.
const fs = require('node:fs');
const path = require('node:path');

const file = path.join(__dirname, '..', 'package-lock.json');
const lock = JSON.parse(fs.readFileSync(file, 'utf8'));
const names = new Set(Object.keys(lock.packages).map((k) => k.replace(/^.*node_modules\//, '')));
let dropped = 0;
for (const entry of Object.values(lock.packages)) {
  const optional = entry.optionalDependencies;
  if (!optional) continue;
  for (const name of Object.keys(optional)) {
    if (!names.has(name)) {
      delete optional[name];
      dropped++;
    }
  }
  if (Object.keys(optional).length === 0) delete entry.optionalDependencies;
}
fs.writeFileSync(file, `${JSON.stringify(lock, null, 2)}\n`);
console.log(`dropped ${dropped} optional dependencies absent from the lock`);
