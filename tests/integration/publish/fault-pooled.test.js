'use strict';
// The publish fault test (fault.test.js) in pooled mode: the same transactions, faults,
// SIGKILL, step-downs and invariants, with the proxy's clients sharing pool_size = 16 upstream
// connections and 4,000 client connections open through it (FAULT_POOL_SIZE and FAULT_CLIENTS
// change that; FAULT_TXNS and FAULT_SESSIONS scale it as there).
process.env.FAULT_POOL_SIZE = process.env.FAULT_POOL_SIZE || '16';
require('./fault.test.js');
