// RUN: not stageml-opt %s 2>&1 | filecheck %s

// The operand and result of bt.lift share one IRDL constraint variable, so
// their types must be equal; this lift also transposes.

func.func @main(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight"}) -> !torch.vtensor<[8,4],f32> attributes {bt.program = "main"} {
  // CHECK: stageml-opt: error: Unable to parse module assembly:
  // CHECK-NEXT: error: "{{.*}}":[[# @LINE + 2]]:8: expected '!torch.vtensor<[4,8],f32>' but got '!torch.vtensor<[8,4],f32>'
  // CHECK-NEXT: note: "{{.*}}":[[# @LINE + 1]]:8: see current operation: %0 = "bt.lift"(%arg0)
  %0 = "bt.lift"(%arg0) {from = #bt.time<"static">, to = #bt.time<"dynamic">, name = "fc.weight"} : (!torch.vtensor<[4,8],f32>) -> !torch.vtensor<[8,4],f32>
  return %0 : !torch.vtensor<[8,4],f32>
}
// CHECK-NOT: Traceback
