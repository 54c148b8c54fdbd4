/* Proof-of-work solver, run as a Web Worker so the page stays responsive: finds a nonce such that
 * SHA-256("<challenge>:<nonce>") starts with `difficulty` zero bits (what queueing/pow.py checks).
 * Posts {tries, expected} now and then, and {nonce, tries} when done. */
"use strict";

function zeroBits(bytes) {
  var count = 0;
  for (var i = 0; i < bytes.length; i++) {
    var b = bytes[i];
    if (b === 0) { count += 8; continue; }
    while ((b & 0x80) === 0) { count++; b <<= 1; }
    return count;
  }
  return count;
}

self.onmessage = function (event) {
  var challenge = event.data.challenge, difficulty = event.data.difficulty;
  var encoder = new TextEncoder(), prefix = challenge + ":", batch = 512, expected = Math.pow(2, difficulty);
  function round(start) {
    var jobs = [];
    for (var i = start; i < start + batch; i++) {
      jobs.push(crypto.subtle.digest("SHA-256", encoder.encode(prefix + i.toString(16))));
    }
    Promise.all(jobs).then(function (digests) {
      for (var j = 0; j < digests.length; j++) {
        if (zeroBits(new Uint8Array(digests[j])) >= difficulty) {
          self.postMessage({ nonce: (start + j).toString(16), tries: start + j + 1 });
          return;
        }
      }
      self.postMessage({ tries: start + batch, expected: expected });
      round(start + batch);
    });
  }
  round(0);
};
