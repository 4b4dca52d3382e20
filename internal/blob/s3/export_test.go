package s3

// PutOptions are the options Put sends, for tests of the server's checks.
var PutOptions = putOptions
