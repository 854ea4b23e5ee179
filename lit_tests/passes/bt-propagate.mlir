// RUN: stageml-opt %s -p bt-propagate | filecheck %s

// Each op gets the join (latest) of its operands' times; constants are
// static; effectful ops are dynamic whatever their operands. The input is
// bt-annotate's output: only the arguments have times.

// CHECK-LABEL: func.func @main
// CHECK-SAME: {bt.name = "fc.weight", bt.time = #bt.time<"static">}
// CHECK-SAME: {bt.name = "fc.lora_A.weight", bt.time = #bt.time<"adapter">}
// CHECK-SAME: {bt.name = "x", bt.time = #bt.time<"dynamic">}
// CHECK-SAME: attributes {bt.program = "main"}
// CHECK:      %int0 = torch.constant.int 0 {bt.time = #bt.time<"static">}
// CHECK:      %int1 = torch.constant.int 1 {bt.time = #bt.time<"static">}
// CHECK:      %float2.000000e00 = torch.constant.float 2.000000e+00 {bt.time = #bt.time<"static">}
// CHECK:      %true = torch.constant.bool true {bt.time = #bt.time<"static">}
// CHECK:      %[[WT:.*]] = torch.aten.transpose.int %arg0, %int0, %int1 {bt.time = #bt.time<"static">}
// CHECK:      %[[AT:.*]] = torch.aten.transpose.int %arg1, %int0, %int1 {bt.time = #bt.time<"adapter">}
// CHECK:      %[[S:.*]] = torch.aten.mul.Scalar %[[AT]], %float2.000000e00 {bt.time = #bt.time<"adapter">}
// CHECK:      %[[Y:.*]] = torch.aten.matmul %arg2, %[[WT]] {bt.time = #bt.time<"dynamic">}
// CHECK:      %[[D:.*]] = torch.aten.dropout %[[WT]], %float2.000000e00, %true {bt.time = #bt.time<"dynamic">}
// CHECK:      return %[[Y]], %[[S]], %[[D]] :
// CHECK-NOT:  bt.time
func.func @main(%arg0: !torch.vtensor<[4,8],f32> {bt.name = "fc.weight", bt.time = #bt.time<"static">}, %arg1: !torch.vtensor<[2,8],f32> {bt.name = "fc.lora_A.weight", bt.time = #bt.time<"adapter">}, %arg2: !torch.vtensor<[?,8],f32> {bt.name = "x", bt.time = #bt.time<"dynamic">}) -> (!torch.vtensor<[?,4],f32>, !torch.vtensor<[8,2],f32>, !torch.vtensor<[8,4],f32>) attributes {bt.program = "main"} {
  %int0 = torch.constant.int 0
  %int1 = torch.constant.int 1
  %float2.000000e00 = torch.constant.float 2.000000e+00
  %true = torch.constant.bool true
  %0 = torch.aten.transpose.int %arg0, %int0, %int1 : !torch.vtensor<[4,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,4],f32>
  %1 = torch.aten.transpose.int %arg1, %int0, %int1 : !torch.vtensor<[2,8],f32>, !torch.int, !torch.int -> !torch.vtensor<[8,2],f32>
  %2 = torch.aten.mul.Scalar %1, %float2.000000e00 : !torch.vtensor<[8,2],f32>, !torch.float -> !torch.vtensor<[8,2],f32>
  %3 = torch.aten.matmul %arg2, %0 : !torch.vtensor<[?,8],f32>, !torch.vtensor<[8,4],f32> -> !torch.vtensor<[?,4],f32>
  %4 = torch.aten.dropout %0, %float2.000000e00, %true : !torch.vtensor<[8,4],f32>, !torch.float, !torch.bool -> !torch.vtensor<[8,4],f32>
  return %3, %2, %4 : !torch.vtensor<[?,4],f32>, !torch.vtensor<[8,2],f32>, !torch.vtensor<[8,4],f32>
}
