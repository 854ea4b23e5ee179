// RUN: not stageml-opt %s 2>&1 | filecheck %s

// A pair's form is "factorized", "merged" or "evicted"; the verifier refuses any other.

// CHECK: stageml-opt: error: Unable to parse module assembly:
// CHECK-NEXT: error: "{{.*}}":[[# @LINE + 2]]:1: '"hot"' does not satisfy the constraint
// CHECK-NEXT: note: "{{.*}}":[[# @LINE + 1]]:1: see current operation: "plan.pair"()
"plan.pair"() {layer = 0 : i64, tenant = "a", expert = 0 : i64, form = "hot", bytes = 512 : i64, tokens = 0 : i64, reason = "r"} : () -> ()
// CHECK-NOT: Traceback
