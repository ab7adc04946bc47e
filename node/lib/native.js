'use strict';
// Loads the addon built by `npm run build` (or `cargo xtask node`).
// ASKPOOL_NATIVE points at another build (e.g. a debug one).
const path = require('node:path');

const file = process.env.ASKPOOL_NATIVE || path.join(__dirname, '..', 'askpool.node');
module.exports = require(file);
