// RUN: stageml-opt %s | filecheck %s
// RUN: stageml-opt %s | stageml-opt | filecheck %s

// #bt.time on arguments and ops, the bt.program fact, and the generic "bt.lift" and "bt.gather" ops, parse and
// print back (the printed form parses again to the same text).

// CHECK-LABEL: func.func @main
// CHECK-SAME:    (%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">},
// CHECK-SAME:     %arg1: !torch.vtensor<[4,8],f32> {bt.name = "fc.delta", bt.time = #bt.time<"adapter">},
// CHECK-SAME:     %arg2: !torch.vtensor<[4,8],f32> {bt.time = #bt.time<"dynamic">})
// CHECK-SAME:    attributes {bt.program = "main"}
// CHECK-NEXT:  %[[C:[a-z0-9_]+]] = torch.constant.int 1 {bt.time = #bt.time<"static">}
// Attributes print sorted by name.
// CHECK-NEXT:  %[[L0:[0-9]+]] = "bt.lift"(%arg0) {from = #bt.time<"static">, name = "fc.weight", to = #bt.time<"adapter">} : (!torch.vtensor<[4,8],f32>) -> !torch.vtensor<[4,8],f32>
// CHECK-NEXT:  %[[A:[0-9]+]] = torch.aten.add.Tensor %[[L0]], %arg1, %[[C]] {bt.time = #bt.time<"adapter">}
// CHECK-NEXT:  %[[L1:[0-9]+]] = "bt.lift"(%[[A]]) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "adapter.0", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,8],f32>) -> !torch.vtensor<[4,8],f32>
// CHECK-NEXT:  return %[[L1]] : !torch.vtensor<[4,8],f32>
func.func @main(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[4,8],f32> {bt.name = "fc.delta", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[4,8],f32> {bt.time = #bt.time<"dynamic">}) -> !torch.vtensor<[4,8],f32> attributes {bt.program = "main"} {
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %0 = "bt.lift"(%arg0) {to = #bt.time<"adapter">, name = "fc.weight", from = #bt.time<"static">} : (!torch.vtensor<[4,8],f32>) -> !torch.vtensor<[4,8],f32>
  %1 = torch.aten.add.Tensor %0, %arg1, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,8],f32>, !torch.vtensor<[4,8],f32>, !torch.int -> !torch.vtensor<[4,8],f32>
  %2 = "bt.lift"(%1) {from = #bt.time<"adapter">, to = #bt.time<"dynamic">, name = "adapter.0", bt.time = #bt.time<"dynamic">} : (!torch.vtensor<[4,8],f32>) -> !torch.vtensor<[4,8],f32>
  return %2 : !torch.vtensor<[4,8],f32>
}

// bt.gather: an earlier-stage stack indexed by each row's id; the result has
// a leading row dimension. `stack = "slots"` indexes the per-slot copies of
// the value (per-tenant state), `stack = "leading"` the value's own leading
// dimension (an expert stack).
// CHECK-LABEL: func.func @rows
// CHECK-NEXT:  %[[G:[0-9]+]] = "bt.gather"(%arg0, %arg1) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "adapter.0", stack = "slots", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,8],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,4,8],f32>
// CHECK-NEXT:  %[[E:[0-9]+]] = "bt.gather"(%arg2, %arg1) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "experts", stack = "leading", to = #bt.time<"dynamic">} : (!torch.vtensor<[3,4,8],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,4,8],f32>
// CHECK-NEXT:  return %[[G]], %[[E]]
func.func @rows(%arg0: !torch.vtensor<[4,8],f32>, %arg1: !torch.vtensor<[?],si64>, %arg2: !torch.vtensor<[3,4,8],f32>) -> (!torch.vtensor<[?,4,8],f32>, !torch.vtensor<[?,4,8],f32>) {
  %0 = "bt.gather"(%arg0, %arg1) {from = #bt.time<"adapter">, to = #bt.time<"dynamic">, name = "adapter.0", stack = "slots", bt.time = #bt.time<"dynamic">} : (!torch.vtensor<[4,8],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,4,8],f32>
  %1 = "bt.gather"(%arg2, %arg1) {stack = "leading", from = #bt.time<"static">, to = #bt.time<"dynamic">, name = "experts", bt.time = #bt.time<"dynamic">} : (!torch.vtensor<[3,4,8],f32>, !torch.vtensor<[?],si64>) -> !torch.vtensor<[?,4,8],f32>
  return %0, %1 : !torch.vtensor<[?,4,8],f32>, !torch.vtensor<[?,4,8],f32>
}

// bt.measure: an adapter-time value the stage reports to the runtime (a
// re-quantized merge's error), about the sites it names.
// CHECK-LABEL: func.func @measure
// CHECK-NEXT:  "bt.measure"(%arg0) {bt.time = #bt.time<"adapter">, name = "quantization_error.0", sites = ["fc.lora_A.default.weight"]} : (!torch.vtensor<[2],f32>) -> ()
// CHECK-NEXT:  return
func.func @measure(%arg0: !torch.vtensor<[2],f32> {bt.time = #bt.time<"adapter">}) attributes {bt.program = "main"} {
  "bt.measure"(%arg0) {name = "quantization_error.0", sites = ["fc.lora_A.default.weight"], bt.time = #bt.time<"adapter">} : (!torch.vtensor<[2],f32>) -> ()
  return
}
