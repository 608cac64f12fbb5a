// Package consumernode holds the tests of the TypeScript example consumer
// on Node.js in this directory (README.md): they install its npm packages
// (npm ci, from package-lock.json), compile it with tsc, and run it against
// real servers and the relayd binary. The consumer itself is src/*.ts.
package consumernode
