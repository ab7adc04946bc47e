'use strict';
// Objects crossing the addon stay here; Rust carries their slot numbers and
// reports a slot free when it drops its last reference (the FREE event).

class ObjectTable {
  constructor() {
    this.items = [];
    this.free = [];
  }

  put(value) {
    if (this.free.length > 0) {
      const id = this.free.pop();
      this.items[id] = value;
      return id;
    }
    this.items.push(value);
    return this.items.length - 1;
  }

  get(id) {
    return this.items[id];
  }

  release(id) {
    this.items[id] = undefined;
    this.free.push(id);
  }

  /** Objects Rust still references. */
  get live() {
    return this.items.length - this.free.length;
  }
}

module.exports = { ObjectTable };
