// RUN: stageml-opt %s -p bt-split | filecheck %s

// With no used adapter-time argument (fc.delta is static here; the inactive
// adapter's weight is unused) there is no @adapter stage: @static returns
// both folded values, @forward takes them as parameters.

// CHECK-NOT:   func.func @adapter
// CHECK-LABEL: func.func @static
// CHECK-SAME:    -> (!torch.vtensor<[8,4],f32> {bt.kind = "parameter", bt.name = "static.0"}, !torch.vtensor<[8,4],f32> {bt.kind = "parameter", bt.name = "static.1"})
// CHECK-SAME:    attributes {bt.program = "main", bt.stage = "static"}
// CHECK-NOT:   func.func @adapter
// CHECK-LABEL: func.func @forward
// CHECK-SAME:    %arg0: !torch.vtensor<[8,4],f32> {bt.kind = "parameter", bt.name = "static.0"}
// CHECK-SAME:    %arg1: !torch.vtensor<[8,4],f32> {bt.kind = "parameter", bt.name = "static.1"}
// CHECK-SAME:    %arg2: !torch.vtensor<[4,8],f32> {bt.kind = "parameter", bt.name = "fc.weight"}
// CHECK-SAME:    %arg3: !torch.vtensor<[?,8],f32> {bt.kind = "input", bt.name = "x"}
// CHECK-SAME:    attributes {bt.program = "main", bt.stage = "dynamic"}
// CHECK-NOT:   func.func @adapter
// CHECK-NOT:   bt.stage = "adapter"
func.func @main(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[4,8],f32> {bt.name = "fc.delta", bt.time = #bt.time<"static">}, %arg2: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}, %arg3: !torch.vtensor<[2,8],f32> {bt.name = "fc.lora_A.inactive.weight", bt.time = #bt.time<"adapter">}, %arg4: !torch.vtensor<[?,8],f32> {bt.name = "unused_input", bt.time = #bt.time<"dynamic">}) -> (!torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,8],f32>) attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
  %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  %1 = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  %2 = torch.aten.add.Tensor %0, %1, %int1 {bt.time = #bt.time<"static">} : !torch.vtensor<[8,4],f32>, !torch.vtensor<[8,4],f32>, !torch.int -> !torch.vtensor<[8,4],f32>
  %3 = "bt.lift"(%0) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "static.0", to = #bt.time<"dynamic">} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
  %4 = torch.aten.matmul %arg2, %3 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  %5 = torch.aten.matmul %arg2, %3 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  %6 = torch.aten.add.Tensor %4, %5, %int1 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.int -> !torch.vtensor<[?,4],f32>
  %7 = "bt.lift"(%2) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "static.1", to = #bt.time<"dynamic">} : (!torch.vtensor<[8,4],f32>) -> !torch.vtensor<[8,4],f32>
  %8 = torch.aten.matmul %arg2, %7 {bt.time = #bt.time<"dynamic">} : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  %9 = "bt.lift"(%arg0) {bt.time = #bt.time<"dynamic">, from = #bt.time<"static">, name = "fc.weight", to = #bt.time<"dynamic">} : (!torch.vtensor<[4,8],f32>) -> !torch.vtensor<[4,8],f32>
  return %6, %8, %9 : !torch.vtensor<[?,4],f32>, !torch.vtensor<[?,4],f32>, !torch.vtensor<[4,8],f32>
}
