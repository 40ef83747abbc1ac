"""What a request is and how the farm names it: keys, options, targets, builds, queues, codes, manifests."""
