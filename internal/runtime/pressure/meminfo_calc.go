package pressure

// darwinMemory adds up darwin's reclaimable page counts (free, speculative,
// purgeable, file-backed), capped at total.
func darwinMemory(total uint64, pageSize uint32, pages [4]uint32) Memory {
	var avail uint64
	for _, n := range pages {
		avail += uint64(n) * uint64(pageSize)
	}
	return Memory{AvailableBytes: min(avail, total), TotalBytes: total,
		Source: "free + speculative + purgeable + file-backed pages (sysctl vm.page_*_count)"}
}
