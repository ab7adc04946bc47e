'use strict';
// The pure-JS ask the Node binding is compared with: a queue to async
// workers, and a Promise back to the caller.

class JsPool {
  constructor(handler, concurrency) {
    this.handler = handler;
    this.queue = [];
    this.head = 0;
    this.idle = [];
    for (let i = 0; i < concurrency; i++) this.#work();
  }

  ask(msg) {
    return new Promise((resolve, reject) => {
      this.queue.push({ msg, resolve, reject });
      const wake = this.idle.pop();
      if (wake) wake();
    });
  }

  #take() {
    if (this.head === this.queue.length) return undefined;
    const job = this.queue[this.head];
    this.queue[this.head++] = undefined;
    if (this.head === this.queue.length) {
      this.queue.length = 0;
      this.head = 0;
    }
    return job;
  }

  async #work() {
    for (;;) {
      const job = this.#take();
      if (job === undefined) {
        await new Promise((r) => this.idle.push(r));
        continue;
      }
      try {
        job.resolve(await this.handler(job.msg));
      } catch (e) {
        job.reject(e);
      }
    }
  }
}

module.exports = { JsPool };
