package rdma

import "sync"

// processPages is the process's one Pages, made on first use as the
// process's libibverbs is (Default). Page locks belong to the process, and
// a Pages may take only pages no holder of its own counts: two Pages would
// each lock pages the other's holds count, and a fresh mapping that one of
// them locked would pass the other's check.
var processPages = sync.OnceValue(NewPages)

// ProcessPages returns this process's Pages, which every registration
// cache of host memory shares.
func ProcessPages() *Pages { return processPages() }
