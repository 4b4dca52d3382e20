package bleve

// SetStepDocs sets stepDocs until the returned func is called.
func SetStepDocs(n uint64) func() {
	old := stepDocs
	stepDocs = n
	return func() { stepDocs = old }
}
