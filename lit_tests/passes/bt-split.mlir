// RUN: stageml-opt %s -p bt-split | filecheck %s
// RUN: stageml-opt %s -p bt-split | filecheck %s --check-prefix=NONE

// @main (bt-lift's output) becomes @static, @adapter and @forward, each with
// its stage and program (bt.stage, bt.program). A later stage's arguments
// are the values lifted from static, then from adapter, then the model's own
// arguments of that time; each says what it holds (bt.kind): a parameter
// (a static value), adapter state (bt.result: which @adapter result), or an
// input (the adapter's weights for @adapter, the request's for @forward).
// Each lift of a computed value is a result of the earlier stage with the
// same bt.name, while a static argument used as it is (fc.weight, returned
// below) is not routed through @static. Constants are cloned into every
// stage that uses them. An unused weight (an inactive adapter's) is
// dropped; an unused request input stays, so that callers pass the inputs
// the model declares. The split IR carries no #bt.time: a stage function's
// ops all belong to its stage.
// (bt-split-no-adapter.mlir: no adapter stage; bt-split-resident.mlir:
// resident state from bt.gather.)

// CHECK-NOT:   func.func @main
// CHECK-LABEL: func.func @static
// CHECK-SAME:    (%arg0: !torch.vtensor<[4,8],f32> {bt.kind = "parameter", bt.name = "fc.weight"})
// CHECK-SAME:    -> (!torch.vtensor<[8,4],f32> {bt.kind = "parameter", bt.name = "static.0"})
// CHECK-SAME:    attributes {bt.program = "main", bt.stage = "static"}
// CHECK:         %[[WT:[0-9]+]] = torch.aten.transpose.int %arg0, %int0, %int1 : 
// CHECK-NEXT:    return %[[WT]] : !torch.vtensor<[8,4],f32>

// CHECK-LABEL: func.func @adapter
// CHECK-SAME:    (%arg0: !torch.vtensor<[8,4],f32> {bt.kind = "parameter", bt.name = "static.0"},
// CHECK-SAME:     %arg1: !torch.vtensor<[4,8],f32> {bt.kind = "input", bt.name = "fc.delta"})
// CHECK-SAME:    -> (!torch.vtensor<[8,4],f32> {bt.kind = "state", bt.name = "adapter.0"})
// CHECK-SAME:    attributes {bt.program = "main", bt.stage = "adapter"}
// CHECK-DAG:     %int0 = torch.constant.int 0
// CHECK-DAG:     %int1 = torch.constant.int 1
// CHECK:         %[[DT:[0-9]+]] = torch.aten.transpose.int %arg1, %int0, %int1 :
// CHECK-NEXT:    %[[M:[0-9]+]] = torch.aten.add.Tensor %arg0, %[[DT]], %int1 :
// CHECK-NEXT:    return %[[M]] : !torch.vtensor<[8,4],f32>

// CHECK-LABEL: func.func @forward
// CHECK-SAME:    (%arg0: !torch.vtensor<[8,4],f32> {bt.kind = "parameter", bt.name = "static.0"},
// CHECK-SAME:     %arg1: !torch.vtensor<[4,8],f32> {bt.kind = "parameter", bt.name = "fc.weight"},
// CHECK-SAME:     %arg2: !torch.vtensor<[8,4],f32> {bt.kind = "state", bt.name = "adapter.0", bt.result = 0 : i64},
// CHECK-SAME:     %arg3: !torch.vtensor<[?,8],f32> {bt.kind = "input", bt.name = "x"},
// CHECK-SAME:     %arg4: !torch.vtensor<[?,8],f32> {bt.kind = "input", bt.name = "unused_input"})
// CHECK-SAME:    -> (!torch.vtensor<[?,4],f32> {bt.kind = "output", bt.name = "output.0"}, !torch.vtensor<[?,4],f32> {bt.kind = "output", bt.name = "output.1"}, !torch.vtensor<[4,8],f32> {bt.kind = "output", bt.name = "output.2"})
// CHECK-SAME:    attributes {bt.program = "main", bt.stage = "dynamic"}
// CHECK-NOT:     transpose
// CHECK:         %[[Y0:[0-9]+]] = torch.aten.matmul %arg3, %arg0 :
// CHECK-NEXT:    %[[Y1:[0-9]+]] = torch.aten.matmul %arg3, %arg0 :
// CHECK-NEXT:    %int1 = torch.constant.int 1
// CHECK-NEXT:    %[[SUM:[0-9]+]] = torch.aten.add.Tensor %[[Y0]], %[[Y1]], %int1 :
// CHECK-NEXT:    %[[Y2:[0-9]+]] = torch.aten.matmul %arg3, %arg2 :
// CHECK-NEXT:    return %[[SUM]], %[[Y2]], %arg1 :

// Nowhere: no binding time, no lift, no @main, no inactive adapter weight.
// NONE-NOT: bt.time
// NONE-NOT: bt.lift
// NONE-NOT: @main
// NONE-NOT: fc.lora_A.inactive.weight
func.func @main(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[4,8],f32> {bt.name = "fc.delta", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg3: !torch.vtensor<[2,8],f32> {bt.name = "fc.lora_A.inactive.weight", bt.time = #bt.time<"adapter">}, %arg4: !torch.vtensor<[?,8],f32> {bt.name = "unused_input", bt.time = #bt.time<"dynamic">}) -> (!torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,8],f32>) attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  %1 = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  %2 = "bt.lift"(%0) {bt.time = #bt.time<"adapter">, from = #bt.time<"static">, name = "static.0", to = #bt.time<"adapter">} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
  %3 = torch.aten.add.Tensor %2, %1, %int1 {bt.time = #bt.time<"adapter">} : !torch.vtensor<[8,4],f32>, !torch.vtensor<[8,4],f32>, !torch.int -> !torch.vtensor<[8,4],f32>
  %4 = "bt.lift"(%0) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "static.0", to = #bt.time<"dynamic">} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
  %5 = torch.aten.matmul %arg2, %4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  %6 = torch.aten.matmul %arg2, %4 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  %7 = torch.aten.add.Tensor %5, %6, %int1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.int -> !torch.vtensor<[?,4],f32>
  %8 = "bt.lift"(%3) {bt.time = #bt.time<"dynamic">, from = #bt.time<"adapter">, name = "adapter.0", to = #bt.time<"dynamic">} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
  %9 = torch.aten.matmul %arg2, %8 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  %10 = "bt.lift"(%arg0) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "fc.weight", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,8],f32>) -> !torch.vtensor<[4,8],f32>
  return %7, %9, %10 : !torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,8],f32>
}
