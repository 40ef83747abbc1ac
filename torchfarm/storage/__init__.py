"""The artifact cache, the job board and the blobs, in Redis or S3."""
